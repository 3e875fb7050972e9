"""The embedding work that the micro-benchmarks and the plan executor time.

A device's work in one training step of a table-/column-sharded model is: pooled lookups of
its tables for the whole batch (forward), an all-to-all that sends every rank its share of
the samples, the reverse all-to-all of the gradients, and the lookups' backward with a
sparse SGD update (what fused embedding kernels do in their backward).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from distrec.errors import DistrecError
from distrec.parallel.comm import all_to_all
from distrec.planner.indices import sample_bags
from distrec.planner.types import TableSpec

LEARNING_RATE = 0.01
THREADS_PER_DEVICE = 1
"""Intra-op threads of each device process; on the CPU one process with one thread is one device."""


def default_device() -> torch.device:
    """The current accelerator (CUDA, ...) if there is one, else the CPU."""
    return torch.accelerator.current_accelerator() or torch.device("cpu")


def measurement_device(name: str | torch.device | None) -> torch.device:
    """The device ``name`` (default: ``default_device()``) if this machine has one; DistrecError
    saying which devices it has otherwise.

    Example:
        >>> measurement_device("cpu")
        device(type='cpu')
    """
    if name is None:
        return default_device()
    here = sorted({"cpu", default_device().type})
    fix = f"use --device {' or '.join(here)}, or leave --device out"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DistrecError(f"--device {name} is not a torch device type; {fix}") from None
    if device.type not in here:
        raise DistrecError(f"--device {name}: this machine has no {device.type} device; {fix}")
    return device


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on ``device`` (no-op on the CPU)."""
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def compute_clock(device: torch.device) -> Callable[[], float]:
    """The clock (seconds) that times compute on ``device``.

    On the CPU a device is one process with one intra-op thread, so its busy time is the CPU
    time of the calling thread (``time.thread_time``): time the OS gives to other processes
    on a shared machine does not count. Accelerators are timed by the wall clock around a
    synchronisation.
    """
    return time.thread_time if device.type == "cpu" else time.perf_counter


def timed_ms(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """``fn()`` and its compute time in ms on ``device`` (see ``compute_clock``)."""
    clock = compute_clock(device)
    start = clock()
    out = fn()
    synchronize(device)
    return out, (clock() - start) * 1e3


def compute_ms(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Compute time of ``fn()`` in ms: the minimum over ``repeats`` runs after ``warmup`` runs.

    The minimum, not the median: on a machine shared with other jobs, contention (another
    process on the core, evicted caches) only ever adds time, even to the thread CPU time
    of ``compute_clock``, so the fastest run is the most repeatable estimate of the work
    itself. On an accelerator the minimum of kernel times is as standard a choice.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    return min(timed_ms(fn, device)[1] for _ in range(repeats))


class LookupWorkload:
    """Embedding-bag lookups of some tables on one device, with sparse SGD updates.

    Args:
        tables: the tables (column shards count as tables of their width).
        batch_size: samples per batch.
        device: where weights and indices live.
        rng: source of the weights and of the index batch (one batch, reused each step).
    """

    def __init__(self, tables: list[TableSpec], batch_size: int, device: torch.device, rng: np.random.Generator) -> None:
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        self.weights = [torch.randn(t.num_rows, t.dim, generator=gen).mul_(0.01).to(device).requires_grad_() for t in tables]
        bags = [sample_bags(t, batch_size, rng) for t in tables]
        self.inputs = [(torch.from_numpy(v).to(device), torch.from_numpy(o[:-1]).to(device)) for v, o in bags]
        self.optimizer = torch.optim.SGD(self.weights, lr=LEARNING_RATE) if tables else None
        self.batch_size = batch_size
        self.device = device
        self.dim_sum = sum(t.dim for t in tables)

    def forward(self) -> torch.Tensor:
        """Pooled embeddings of every table side by side: float [batch_size, dim_sum]."""
        if not self.weights:
            return torch.zeros(self.batch_size, 0, device=self.device)
        pooled = [F.embedding_bag(v, w, o, mode="sum", sparse=True) for w, (v, o) in zip(self.weights, self.inputs)]
        return torch.cat(pooled, dim=1)

    def step(self, grad: torch.Tensor | None = None) -> torch.Tensor:
        """Forward, backward of ``grad`` (ones if None) into the tables, SGD update.

        Returns:
            The pooled embeddings (detached), float [batch_size, dim_sum].
        """
        pooled = self.forward()
        if self.optimizer is not None:
            pooled.backward(torch.ones_like(pooled) if grad is None else grad)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return pooled.detach()


def _rows_per_rank(batch_size: int, world_size: int) -> int:
    if batch_size % world_size:
        raise DistrecError(f"batch size {batch_size} is not divisible by {world_size} devices; choose a multiple")
    return batch_size // world_size


def forward_all_to_all(pooled: torch.Tensor, dim_sums: list[int]) -> torch.Tensor:
    """Send every rank its slice of the samples of this rank's pooled embeddings.

    Args:
        pooled: float [batch_size, dim_sums[rank]] this rank's tables for the whole batch.
        dim_sums: summed output dimension of every rank.

    Returns:
        float [batch_size / world, sum(dim_sums)]: all ranks' columns for this rank's samples.
    """
    world = len(dim_sums)
    local = _rows_per_rank(pooled.shape[0], world)
    out = all_to_all(pooled.reshape(-1), [local * d for d in dim_sums], [local * pooled.shape[1]] * world)
    parts = out.split([local * d for d in dim_sums])
    return torch.cat([p.view(local, d) for p, d in zip(parts, dim_sums)], dim=1)


def backward_all_to_all(grad: torch.Tensor, dim_sums: list[int], rank: int) -> torch.Tensor:
    """The reverse of ``forward_all_to_all``: return each rank the gradients of its columns.

    Args:
        grad: float [batch_size / world, sum(dim_sums)] gradients for this rank's samples.
        dim_sums: summed output dimension of every rank.
        rank: this rank.

    Returns:
        float [batch_size, dim_sums[rank]].
    """
    world = len(dim_sums)
    local = grad.shape[0]
    send = torch.cat([c.reshape(-1) for c in grad.split(dim_sums, dim=1)])
    out = all_to_all(send, [local * dim_sums[rank]] * world, [local * d for d in dim_sums])
    return out.view(world * local, dim_sums[rank])


def communication_step(pooled: torch.Tensor, dim_sums: list[int], rank: int, device: torch.device) -> tuple[torch.Tensor, float, float]:
    """A training step's all-to-alls: forward of ``pooled``, then backward of what arrived.

    Returns:
        (the gradients returned to this rank, float [batch_size, dim_sums[rank]]; the forward
        and the backward all-to-all wall times in ms, including waiting for late ranks).
    """
    start = time.perf_counter()
    received = forward_all_to_all(pooled, dim_sums)
    synchronize(device)
    middle = time.perf_counter()
    grad = backward_all_to_all(received, dim_sums, rank)
    synchronize(device)
    return grad, (middle - start) * 1e3, (time.perf_counter() - middle) * 1e3
