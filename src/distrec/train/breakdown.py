"""Per-iteration time breakdown: where each training step spends its milliseconds."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from distrec.io import atomic_write_json

# The components of one iteration, in the order they happen (the bars are stacked so).
COMPONENTS = (
    "data_loading",
    "input_all_to_all",
    "lookup",
    "output_all_to_all",
    "dense_forward",
    "loss",
    "backward",
    "gradient_all_reduce",
    "optimizer",
)


class StepTimer:
    """Accumulates milliseconds per component for every step, then summarises them.

    On CUDA it synchronises the device at each boundary, so that asynchronous kernels are
    charged to the component that launched them.
    """

    def __init__(self, device: torch.device | None = None, skip_first: int = 5) -> None:
        self.sync = device is not None and device.type == "cuda"
        self.skip_first = skip_first
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = defaultdict(float)

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self._now()
        yield
        self.current[name] += (self._now() - start) * 1e3

    def add(self, name: str, ms: float) -> None:
        """Charge ``ms`` measured elsewhere (e.g. inside a module) to ``name``."""
        self.current[name] += ms

    def end_step(self) -> None:
        self.steps.append(dict(self.current))
        self.current = defaultdict(float)

    def summary(self) -> dict[str, dict[str, float]]:
        """Mean and median ms per component over the measured steps (warm-up steps skipped)."""
        steps = self.steps[self.skip_first :] or self.steps
        out = {}
        for name in COMPONENTS:
            values = np.array([s.get(name, 0.0) for s in steps]) if steps else np.zeros(1)
            out[name] = {"mean_ms": float(values.mean()), "median_ms": float(np.median(values))}
        return out

    def write(self, path: Path, **extra) -> None:
        """Write ``{"components": summary, "steps": n, **extra}`` as JSON (atomically)."""
        atomic_write_json(path, {"components": self.summary(), "steps": len(self.steps), **extra})
