"""Per-iteration time breakdown: where each training step spends its milliseconds."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from distrec.components.exchange import ExchangeStats
from distrec.data.batch import Batch
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
    "replica_sync",
    "optimizer",
)
COLLECTIVES = ("input_all_to_all", "output_all_to_all", "gradient_all_reduce", "replica_sync")
"""The components that send bytes (the keys of ``bytes_per_step``)."""


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length in ms of the union of (start, end) intervals in seconds."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total * 1e3


class StepTimer:
    """Accumulates milliseconds per component for every step, then summarises them.

    ``TrainStep`` charges ``forward``, ``loss``, ``backward``, ``gradient_all_reduce`` and
    ``optimizer``; the trainer charges ``data_loading`` and, to ``loss``, the check that the
    loss is finite on every rank (an all-reduce); a parallel mode charges its own
    collectives (``replica_sync``: time with ``phase``, bytes with ``add_bytes``). A phase
    inside another is charged to itself only. At the end of each step the forward time is
    split with what the watched modules reported:

    - ``watch_embeddings(module, exchange)``: time inside the embedding module (training
      forwards only) is ``lookup``, the rest of the forward ``dense_forward``; the exchange
      statistics of a sharded module (``input_ms``, ``output_ms``) move its all-to-all time
      to ``input_all_to_all`` and ``output_all_to_all``, and its bytes are charged there;
    - ``watch_ddp(ddp)``: the time during which a DDP gradient all-reduce was in flight
      (it overlaps backward) moves from ``backward`` to ``gradient_all_reduce``.

    On CUDA it synchronises the device at each boundary, so that asynchronous kernels are
    charged to the component that launched them.
    """

    def __init__(self, device: torch.device | None = None, skip_first: int = 5) -> None:
        self.sync = device is not None and device.type == "cuda"
        self.skip_first = skip_first
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = defaultdict(float)
        self.step_bytes: list[dict[str, int]] = []
        self.current_bytes: dict[str, int] = defaultdict(int)
        self._nested_ms: list[float] = []  # per open phase, the ms of the phases inside it
        self._embedding_ms = 0.0
        self._all_reduces: list[tuple[float, float]] = []

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the time inside the block to ``name``, less that of the phases inside it."""
        start = self._now()
        self._nested_ms.append(0.0)
        try:
            yield
        finally:
            ms = (self._now() - start) * 1e3
            self.current[name] += ms - self._nested_ms.pop()
            if self._nested_ms:
                self._nested_ms[-1] += ms

    def add(self, name: str, ms: float) -> None:
        """Charge ``ms`` measured elsewhere (e.g. inside a module) to ``name``."""
        self.current[name] += ms

    def add_bytes(self, name: str, sent: int) -> None:
        """Charge ``sent`` bytes sent by this rank to the collective component ``name``."""
        self.current_bytes[name] += sent

    def watch_embeddings(self, module: torch.nn.Module, exchange: Callable[[], ExchangeStats | None] = lambda: None) -> None:
        """Time every training forward of ``module``; ``exchange()`` gives the all-to-all
        statistics of its last forward (see the class doc)."""
        started: list[float] = []

        def before(mod, args) -> None:
            if mod.training:
                started.append(self._now())

        def after(mod, args, output) -> None:
            if mod.training and started:
                ms = (self._now() - started.pop()) * 1e3
                self._embedding_ms += ms
                stats = exchange()
                if stats is not None:
                    self.current["input_all_to_all"] += stats.input_ms
                    self.current["output_all_to_all"] += stats.output_ms
                    self.add_bytes("input_all_to_all", stats.input_bytes)
                    self.add_bytes("output_all_to_all", stats.output_bytes)
                    ms -= stats.input_ms + stats.output_ms
                self.current["lookup"] += max(0.0, ms)

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)

    def watch_ddp(self, ddp: torch.nn.parallel.DistributedDataParallel) -> None:
        """Record when each of ``ddp``'s gradient buckets is being all-reduced."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def timed_allreduce(group, bucket):
            start = time.perf_counter()

            def done(future):
                self._all_reduces.append((start, time.perf_counter()))
                return future.value()

            return allreduce_hook(group, bucket).then(done)

        ddp.register_comm_hook(ddp.process_group, timed_allreduce)

    def loading(self, batches: Iterator[Batch], device: torch.device) -> Iterator[Batch]:
        """``batches`` moved to ``device``, the wait for each charged to ``data_loading``."""
        while True:
            with self.phase("data_loading"):
                batch = next(batches, None)
                if batch is not None:
                    batch = batch.to(device, non_blocking=True)
            if batch is None:
                return
            yield batch

    def end_step(self) -> None:
        """Close the current step: split its forward and backward time, start the next."""
        step = self.current
        if "forward" in step:
            step["dense_forward"] += max(0.0, step.pop("forward") - self._embedding_ms)
        if self._all_reduces:
            overlap = _union_ms(self._all_reduces)
            step["gradient_all_reduce"] += overlap
            step["backward"] = max(0.0, step["backward"] - overlap)
        self.steps.append(dict(step))
        self.step_bytes.append(dict(self.current_bytes))
        self.current = defaultdict(float)
        self.current_bytes = defaultdict(int)
        self._embedding_ms = 0.0
        self._all_reduces = []

    def summary(self) -> dict[str, dict[str, float]]:
        """Mean and median ms per component over the measured steps (warm-up steps skipped)."""
        steps = self.steps[self.skip_first :] or self.steps
        out = {}
        for name in COMPONENTS:
            values = np.array([s.get(name, 0.0) for s in steps]) if steps else np.zeros(1)
            out[name] = {"mean_ms": float(values.mean()), "median_ms": float(np.median(values))}
        return out

    def bytes_per_step(self) -> dict[str, float]:
        """Mean bytes this rank sent per step in each of ``COLLECTIVES`` charged with
        ``add_bytes`` (every step counted: bytes do not warm up)."""
        return {name: float(np.mean([s.get(name, 0) for s in self.step_bytes])) if self.step_bytes else 0.0 for name in COLLECTIVES}

    def write(self, path: Path, **extra) -> None:
        """Write ``{"components": summary, "steps": n, **extra}`` as JSON (atomically)."""
        atomic_write_json(path, {"components": self.summary(), "steps": len(self.steps), **extra})
