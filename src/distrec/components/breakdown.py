"""Per-iteration time breakdown: where each training step spends its milliseconds."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

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


class HostClock:
    """Wall time on the host: right for work the host does itself (the CPU)."""

    def mark(self) -> float:
        return time.perf_counter()

    def ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3

    def settle(self) -> None:
        """Nothing to wait for: a mark is its time."""


class CudaClock:
    """CUDA events recorded on the current stream: time of the device's work, read without
    stopping the host at each mark (``settle`` waits once for many steps' events)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.last: torch.cuda.Event | None = None

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        self.last = event
        return event

    def ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end)

    def settle(self) -> None:
        """Wait until every event recorded so far has happened."""
        if self.last is not None:
            self.last.synchronize()


Clock = HostClock | CudaClock


def clock_for(device: torch.device | None) -> Clock:
    """CUDA events on a GPU, the host's clock elsewhere."""
    return CudaClock(device) if device is not None and device.type == "cuda" else HostClock()


@dataclass
class _RawStep:
    """A step's measurements before its clock's marks are read."""

    spans: list[tuple[str, Any, Any, int]] = field(default_factory=list)  # (component, start, end, parent span or -1)
    embeddings: list[tuple[Any, Any, ExchangeStats | None]] = field(default_factory=list)  # training forwards of the watched module
    ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # measured elsewhere (``add``)
    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    all_reduces: list[tuple[float, float]] = field(default_factory=list)  # host seconds a DDP bucket was in flight


class StepTimer:
    """Accumulates milliseconds per component for every step, then summarises them.

    ``TrainStep`` charges ``forward``, ``loss``, ``backward``, ``gradient_all_reduce`` and
    ``optimizer``; the trainer charges ``data_loading`` and, to ``loss``, the check that the
    loss is finite on every rank (when one is due); a parallel mode charges its own
    collectives (``replica_sync``: time with ``phase``, bytes with ``add_bytes``). A phase
    inside another is charged to itself only. Each step's forward time is split with what the
    watched modules reported:

    - ``watch_embeddings(module, exchange)``: time inside the embedding module (training
      forwards only) is ``lookup``, the rest of the forward ``dense_forward``; the exchange
      statistics of a sharded module (``input_ms``, ``output_ms``) move its all-to-all time
      to ``input_all_to_all`` and ``output_all_to_all``, and its bytes are charged there;
    - ``watch_ddp(ddp)``: the time during which a DDP gradient all-reduce was in flight
      (it overlaps backward) moves from ``backward`` to ``gradient_all_reduce``.

    The clock is the device's (``clock_for``): on a GPU, CUDA events, read when the steps are
    (``steps``, ``summary``) or every ``SETTLE_EVERY`` steps, so timing adds no host sync to a step.
    """

    SETTLE_EVERY = 64
    """Steps at most whose CUDA events wait to be read."""

    def __init__(self, device: torch.device | None = None, skip_first: int = 5) -> None:
        self.clock = clock_for(device)
        self.skip_first = skip_first
        self._steps: list[dict[str, float]] = []
        self.step_bytes: list[dict[str, int]] = []
        self._pending: list[_RawStep] = []
        self._raw = _RawStep()
        self._open: list[int] = []  # indices in _raw.spans of the phases open now (innermost last)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the time inside the block to ``name``, less that of the phases inside it."""
        spans = self._raw.spans
        index = len(spans)
        spans.append((name, self.clock.mark(), None, self._open[-1] if self._open else -1))
        self._open.append(index)
        try:
            yield
        finally:
            self._open.pop()
            name, start, _, parent = spans[index]
            spans[index] = (name, start, self.clock.mark(), parent)

    def add(self, name: str, ms: float) -> None:
        """Charge ``ms`` measured elsewhere (e.g. inside a module) to ``name``."""
        self._raw.ms[name] += ms

    def add_bytes(self, name: str, sent: int) -> None:
        """Charge ``sent`` bytes sent by this rank to the collective component ``name``."""
        self._raw.sent[name] += sent

    def watch_embeddings(self, module: torch.nn.Module, exchange: Callable[[], ExchangeStats | None] = lambda: None) -> None:
        """Time every training forward of ``module``; ``exchange()`` gives the all-to-all
        statistics of its last forward (see the class doc)."""
        started: list[Any] = []

        def before(mod, args) -> None:
            if mod.training:
                started.append(self.clock.mark())

        def after(mod, args, output) -> None:
            if mod.training and started:
                stats = exchange()
                if stats is not None:
                    self.add_bytes("input_all_to_all", stats.input_bytes)
                    self.add_bytes("output_all_to_all", stats.output_bytes)
                    stats = replace(stats)  # a copy: the module reuses its statistics
                self._raw.embeddings.append((started.pop(), self.clock.mark(), stats))

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)

    def watch_ddp(self, ddp: torch.nn.parallel.DistributedDataParallel) -> None:
        """Record when each of ``ddp``'s gradient buckets is being all-reduced."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def timed_allreduce(group, bucket):
            start = time.perf_counter()
            raw = self._raw

            def done(future):
                raw.all_reduces.append((start, time.perf_counter()))
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
        """Close the current step and start the next; its times are read now on the host's
        clock, later on a GPU's (``steps``)."""
        self._pending.append(self._raw)
        self.step_bytes.append(dict(self._raw.sent))
        self._raw = _RawStep()
        if isinstance(self.clock, HostClock) or len(self._pending) >= self.SETTLE_EVERY:
            self._settle()

    @property
    def steps(self) -> list[dict[str, float]]:
        """Milliseconds per component of every step ended so far."""
        self._settle()
        return self._steps

    def _settle(self) -> None:
        """Read the marks of the pending steps into ``steps``."""
        if not self._pending:
            return
        self.clock.settle()
        for raw in self._pending:
            self._steps.append(self._components(raw))
        self._pending = []

    def _components(self, raw: _RawStep) -> dict[str, float]:
        """One step's ms per component: phases less their inner phases, the forward split into
        lookup, exchanges and dense layers, backward less the all-reduces in flight."""
        step: dict[str, float] = defaultdict(float, raw.ms)
        spans_ms = [self.clock.ms(start, end) for _, start, end, _ in raw.spans]
        for (name, _, _, parent), ms in zip(raw.spans, spans_ms):
            step[name] += ms
            if parent >= 0:
                step[raw.spans[parent][0]] -= ms
        embedding_ms = 0.0
        for start, end, stats in raw.embeddings:
            ms = self.clock.ms(start, end)
            embedding_ms += ms
            if stats is not None:
                step["input_all_to_all"] += stats.input_ms
                step["output_all_to_all"] += stats.output_ms
                ms -= stats.input_ms + stats.output_ms
            step["lookup"] += max(0.0, ms)
        if "forward" in step:
            step["dense_forward"] += max(0.0, step.pop("forward") - embedding_ms)
        if raw.all_reduces:
            overlap = _union_ms(raw.all_reduces)
            step["gradient_all_reduce"] += overlap
            step["backward"] = max(0.0, step["backward"] - overlap)
        return dict(step)

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
