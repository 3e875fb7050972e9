"""Sparse row updates (SGD, row-wise Adagrad) in one pass per touched row, compiled by numba.

In torch operators, a sparse optimizer's update of U distinct rows is several passes over a
[U, D] gradient: sum each row's entries (one new [U, D] tensor), scale it (another), take
row norms (Adagrad), then scatter into the weight. At multi-hot batch sizes U x D is
hundreds of MB and every pass is bound by memory bandwidth. These kernels read each row's
gradient entries once, update the row (and its accumulator) and write it, like FBGEMM's fused
CPU kernels. Distinct rows never collide, so slices of them are updated by several threads
at once (``split_over_threads``; the compiled loop releases the GIL). Not numba's
``parallel=True``: its OpenMP threads spin between regions beside torch's on the same cores.

Row u of ``rows`` gets the sum of ``grad[picks[k]]`` for k in [bounds[u], bounds[u + 1]):
the entries of ``sum_by_row``'s grouping, so a backward pass can hand its pooled output
gradient [bags, D] and the grouping straight to the update without making the summed
gradient. Each row's sum, scale and update are done in float32 in the order the torch
operators use (SGD's result is bit for bit theirs; row-wise Adagrad's row norm adds its
squares in another order; ``tests/test_kernels.py`` compares both).

CPU tensors only (NumPy views share their memory); other devices use the optimizers' torch
operators.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
import torch

from distrec.kernels.accumulators import stack_vector
from distrec.kernels.prefetch import PREFETCH_DISTANCE, prefetch, prefetch_row
from distrec.kernels.rows import numpy_views, split_over_threads


@functools.cache
def _update_kernel(dim: int):
    """The row update compiled for rows of ``dim`` floats (each row's summed gradient in registers)."""

    @numba.njit(nogil=True, cache=True)
    def update_rows(weight, accumulator, rows, bounds, picks, grad, neg_lr, eps, rowwise_adagrad, start, end):  # pragma: no cover - compiled
        """SGD (``rowwise_adagrad`` False: ``accumulator`` unused) or row-wise Adagrad on rows u in
        [start, end). The row ``PREFETCH_DISTANCE`` ahead is fetched early: its weight row, its
        accumulator and its gradient entries (rows of ``grad`` in random order)."""
        total = stack_vector(dim, grad)
        for u in range(start, end):
            if u + PREFETCH_DISTANCE < end:
                prefetch_row(weight, rows[u + PREFETCH_DISTANCE])
                if rowwise_adagrad:
                    prefetch(accumulator, rows[u + PREFETCH_DISTANCE])
                for k in range(bounds[u + PREFETCH_DISTANCE], bounds[u + PREFETCH_DISTANCE + 1]):
                    prefetch_row(grad, picks[k])
            _sum_entries(total, grad, picks, bounds[u], bounds[u + 1])
            r = rows[u]
            scale = neg_lr
            if rowwise_adagrad:
                accumulator[r] += _sum_of_squares(total) / np.float32(dim)
                scale = np.float32(1.0) / (np.sqrt(accumulator[r]) + eps) * neg_lr
            for d in range(dim):
                weight[r, d] += total[d] * scale

    return update_rows


@numba.njit(fastmath={"reassoc"}, cache=True)
def _sum_of_squares(total):  # pragma: no cover - compiled
    """Sum of total[d] ** 2, the additions reordered as the compiler likes (so they vectorise:
    the one place a different rounding is allowed)."""
    squares = np.float32(0.0)
    for d in range(total.shape[0]):
        squares += total[d] * total[d]
    return squares


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
    w, r, b, p, g = numpy_views(weight, rows, bounds, picks, grad)
    update = _update_kernel(weight.shape[1])
    split_over_threads(len(r), lambda start, end: update(w, np.empty(0, np.float32), r, b, p, g, np.float32(-lr), np.float32(0.0), False, start, end))


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
    w, s, r, b, p, g = numpy_views(weight, accumulator, rows, bounds, picks, grad)
    update = _update_kernel(weight.shape[1])
    split_over_threads(len(r), lambda start, end: update(w, s, r, b, p, g, np.float32(-lr), np.float32(eps), True, start, end))
