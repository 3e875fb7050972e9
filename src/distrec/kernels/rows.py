"""Adding vectors to distinct rows of a weight, with the rows split over threads.

``Tensor.index_add_`` on CPU walks its index one row at a time on the calling thread, and
scattering into a large table is bound by the latency of its cache misses, not by
arithmetic. Distinct rows never collide, so disjoint slices of them can be scattered by
several threads at once: torch releases the GIL inside the operator, and each slice is one
call (no per-block hand-offs, no OpenMP barriers).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

MIN_ROWS_PER_THREAD = 16_384
"""Below this many rows per thread, one thread does all (a hand-off costs tens of microseconds)."""

_pool: ThreadPoolExecutor | None = None


def _workers(count: int) -> ThreadPoolExecutor:
    """A pool of at least ``count`` threads, kept for the life of the process."""
    global _pool
    if _pool is None or _pool._max_workers < count:
        _pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="distrec-rows")
    return _pool


def split_over_threads(count: int, work: Callable[[int, int], None], threads: int | None = None, min_per_thread: int | None = None) -> None:
    """Call ``work(start, end)`` on disjoint slices covering [0, count), one slice per thread.

    The calling thread does the first slice; ``work`` must release the GIL to gain anything
    (torch operators and ``nogil`` numba functions do). At most ``threads`` (default
    ``torch.get_num_threads()``) slices, none shorter than ``min_per_thread`` (default
    ``MIN_ROWS_PER_THREAD``).
    """
    parts = max(1, min(threads or torch.get_num_threads(), count // (min_per_thread or MIN_ROWS_PER_THREAD)))
    if parts == 1:
        work(0, count)
        return
    bounds = [count * i // parts for i in range(parts + 1)]
    pending = [_workers(parts - 1).submit(work, a, b) for a, b in zip(bounds[1:-1], bounds[2:])]
    work(0, bounds[1])
    for job in pending:
        job.result()


def numpy_views(*tensors: torch.Tensor) -> list[np.ndarray]:
    """NumPy views (same memory, same strides) of CPU tensors, for compiled kernels to read
    and write through."""
    return [t.detach().numpy() for t in tensors]


def add_to_distinct_rows(weight: torch.Tensor, rows: torch.Tensor, delta: torch.Tensor, threads: int | None = None) -> None:
    """``weight[rows[k]] += delta[k]`` for every k, where ``rows`` holds no row twice.

    Args:
        weight: [num_rows, D] or [num_rows], updated in place.
        rows: int64 [n] distinct rows of ``weight``.
        delta: [n, D] or [n], what to add to each row.
        threads: how many threads share the rows (default ``torch.get_num_threads()``).

    Example:
        >>> w = torch.zeros(4, 2)
        >>> add_to_distinct_rows(w, torch.tensor([3, 0]), torch.ones(2, 2))
        >>> w[:, 0].tolist()
        [1.0, 0.0, 0.0, 1.0]
    """
    weight = weight.detach()  # autograd's no-grad mode does not reach the worker threads
    split_over_threads(rows.numel(), lambda a, b: weight.index_add_(0, rows[a:b], delta[a:b]), threads)
