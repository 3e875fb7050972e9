"""Sparse row updates (SGD, row-wise Adagrad) in one pass per touched row, compiled by numba.

In torch operators, a sparse optimizer's update of U distinct rows is several passes over a
[U, D] gradient: sum each row's entries (one new [U, D] tensor), scale it (another), take
row norms (Adagrad), then scatter into the weight. At multi-hot batch sizes U x D is
hundreds of MB and every pass is bound by memory bandwidth. These kernels read each row's
gradient entries once, update the row (and its accumulator) and write it, like FBGEMM's fused
CPU kernels; distinct rows never collide, so the rows are split over threads.

Row u of ``rows`` gets the sum of ``grad[picks[k]]`` for k in [bounds[u], bounds[u + 1]):
the entries of ``sum_by_row``'s grouping, so a backward pass can hand its pooled output
gradient [bags, D] and the grouping straight to the update without making the summed
gradient. Numerically each row's sum, scale and update are done in float32 in the order the
torch operators use (``tests/test_kernels.py`` compares both).

CPU tensors only (NumPy views share their memory); other devices use the optimizers' torch
operators.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

ROWS_PER_TASK = 512
"""Rows one thread updates per task (the task's [D] sum buffer is allocated once per task)."""


@numba.njit(parallel=True, cache=True)
def _update_rows(weight, accumulator, rows, bounds, picks, grad, neg_lr, eps, rowwise_adagrad):  # pragma: no cover - compiled
    """SGD (``rowwise_adagrad`` False: ``accumulator`` unused) or row-wise Adagrad on each row u."""
    dim = weight.shape[1]
    tasks = (rows.shape[0] + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in numba.prange(tasks):
        total = np.empty(dim, np.float32)
        for u in range(task * ROWS_PER_TASK, min(rows.shape[0], (task + 1) * ROWS_PER_TASK)):
            _sum_entries(total, grad, picks, bounds[u], bounds[u + 1])
            r = rows[u]
            scale = neg_lr
            if rowwise_adagrad:
                squares = np.float32(0.0)
                for d in range(dim):
                    squares += total[d] * total[d]
                accumulator[r] += squares / np.float32(dim)
                scale = np.float32(1.0) / (np.sqrt(accumulator[r]) + eps) * neg_lr
            for d in range(dim):
                weight[r, d] += total[d] * scale


@numba.njit(inline="always")
def _sum_entries(total, grad, picks, start, end):  # pragma: no cover - compiled
    """total[:] = sum of grad[picks[k]] for k in [start, end), added in order of k."""
    first = picks[start]
    for d in range(total.shape[0]):
        total[d] = grad[first, d]
    for k in range(start + 1, end):
        p = picks[k]
        for d in range(total.shape[0]):
            total[d] += grad[p, d]


def _arrays(*tensors: torch.Tensor) -> list[np.ndarray]:
    """NumPy views (same memory, same strides) of CPU tensors: the kernels write through them."""
    return [t.detach().numpy() for t in tensors]


def _threads() -> None:
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def sgd_rows(weight: torch.Tensor, rows: torch.Tensor, bounds: torch.Tensor, picks: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """``weight[rows[u]] -= lr * sum(grad[picks[bounds[u]:bounds[u + 1]]])`` for each u, in place.

    Args:
        weight: float32 [num_rows, D] on the CPU (any strides: a column view works); updated in place.
        rows: int64 [U] distinct rows of ``weight``.
        bounds: int64 [U + 1] each row's range of ``picks``.
        picks: int64 [nnz] rows of ``grad``; every range of ``bounds`` is non-empty.
        grad: float32 [n, D] gradient vectors.
        lr: learning rate.
    """
    _threads()
    w, r, b, p, g = _arrays(weight, rows, bounds, picks, grad)
    _update_rows(w, np.empty(0, np.float32), r, b, p, g, np.float32(-lr), np.float32(0.0), False)


def rowwise_adagrad_rows(
    weight: torch.Tensor,
    accumulator: torch.Tensor,
    rows: torch.Tensor,
    bounds: torch.Tensor,
    picks: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    eps: float,
) -> None:
    """Row-wise Adagrad on the rows of ``sgd_rows``' arguments: for each u, with g the row's
    summed gradient, ``s[r] += mean(g ** 2)``, ``w[r] -= lr * g / (sqrt(s[r]) + eps)``.

    ``accumulator`` is float32 [num_rows] on the CPU (any stride), updated in place.
    """
    _threads()
    w, s, r, b, p, g = _arrays(weight, accumulator, rows, bounds, picks, grad)
    _update_rows(w, s, r, b, p, g, np.float32(-lr), np.float32(eps), True)
