"""DLRM's dot interaction, forward and backward per sample, compiled by numba.

In torch operators the interaction of F sparse vectors is a batched product of [F, D] by
[D, F] matrices (all F^2 dots, where F (F - 1) / 2 are kept), an ``index_select`` of the
kept pairs and a ``cat`` with the dense vector; its backward gathers the pair gradients into
a symmetric [F, F] matrix per sample and multiplies again. Batched products of matrices this
small run far below the CPU's peak (``docs/performance.md``). These kernels
compute, per sample, only the kept dots (vectorised over D) straight into the output row, and
the gradients by one pass over the pairs: ``de_i += g_ij e_j``, ``de_j += g_ij e_i``.

Samples are independent, so results do not depend on how the batch is split over threads;
the dot products add their D terms in an order of the compiler's choosing (vectorised), so
they match the torch operators to rounding, not bit for bit (``tests/test_kernels_interaction.py``).
CPU tensors only (NumPy views share their memory), float32 or float64.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from distrec.kernels.rows import numpy_views, split_over_threads

MIN_SAMPLES_PER_THREAD = 256
"""Below this many samples per thread one thread does all (a sample takes a few microseconds)."""


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _forward(x, e, out, has_dense, self_pair, start, end):  # pragma: no cover - compiled
    """Rows [start, end) of ``out``: x, then the dots of (x, e_1, ..., e_F) in row-major
    upper-triangle order (with the diagonal when ``self_pair`` is 1)."""
    num_sparse, dim = e.shape[1], e.shape[2]
    zero = np.zeros(1, e.dtype)[0]
    for b in range(start, end):
        c = 0
        if has_dense:
            for d in range(dim):
                out[b, d] = x[b, d]
            c = dim
            if self_pair:
                total = zero
                for d in range(dim):
                    total += x[b, d] * x[b, d]
                out[b, c] = total
                c += 1
            for j in range(num_sparse):
                total = zero
                for d in range(dim):
                    total += x[b, d] * e[b, j, d]
                out[b, c] = total
                c += 1
        for i in range(num_sparse):
            for j in range(i + 1 - self_pair, num_sparse):
                total = zero
                for d in range(dim):
                    total += e[b, i, d] * e[b, j, d]
                out[b, c] = total
                c += 1


@numba.njit(inline="always", fastmath={"contract"})
def _add_scaled(y, scale, v):  # pragma: no cover - compiled
    """y += scale * v, for vectors of one length."""
    for d in range(y.shape[0]):
        y[d] += scale * v[d]


@numba.njit(nogil=True, cache=True, fastmath={"contract"})
def _backward(x, e, grad, grad_x, grad_e, has_dense, self_pair, start, end):  # pragma: no cover - compiled
    """Rows [start, end) of ``grad_x`` and ``grad_e`` from the output gradient ``grad``."""
    num_sparse, dim = e.shape[1], e.shape[2]
    for b in range(start, end):
        ge = grad_e[b]
        ge[:, :] = 0
        c = 0
        if has_dense:
            gx = grad_x[b]
            for d in range(dim):
                gx[d] = grad[b, d]
            c = dim
            if self_pair:
                _add_scaled(gx, grad[b, c] + grad[b, c], x[b])
                c += 1
            for j in range(num_sparse):
                g = grad[b, c]
                c += 1
                _add_scaled(gx, g, e[b, j])
                _add_scaled(ge[j], g, x[b])
        for i in range(num_sparse):
            if self_pair:
                _add_scaled(ge[i], grad[b, c] + grad[b, c], e[b, i])
                c += 1
            for j in range(i + 1, num_sparse):
                g = grad[b, c]
                c += 1
                _add_scaled(ge[i], g, e[b, j])
                _add_scaled(ge[j], g, e[b, i])


def dot_interaction(x: torch.Tensor | None, e: torch.Tensor, self_interaction: bool, threads: int | None = None) -> torch.Tensor:
    """``distrec.models.interaction.DotInteraction``'s output, no autograd.

    Args:
        x: dense vectors [B, D] or None; contiguous, the dtype of ``e``.
        e: sparse vectors [B, F, D], contiguous.
        self_interaction: include each vector's dot product with itself.

    Returns:
        [B, D + P] (x, then the P pairs' dots), or [B, P] without ``x``.
    """
    batch_size, num_sparse, dim = e.shape
    n = num_sparse + int(x is not None)
    pairs = n * (n + 1) // 2 if self_interaction else n * (n - 1) // 2
    out = e.new_empty(batch_size, pairs + (dim if x is not None else 0))
    xs, es, outs = numpy_views(x if x is not None else e.new_empty(0, dim), e, out)
    split_over_threads(batch_size, lambda a, b: _forward(xs, es, outs, x is not None, int(self_interaction), a, b), threads, MIN_SAMPLES_PER_THREAD)
    return out


def dot_interaction_backward(
    x: torch.Tensor | None, e: torch.Tensor, grad: torch.Tensor, self_interaction: bool, threads: int | None = None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Gradients of ``dot_interaction``'s inputs from its output gradient ``grad`` (contiguous):
    (grad of x [B, D] or None, grad of e [B, F, D])."""
    grad_x = torch.empty_like(x) if x is not None else None
    grad_e = torch.empty_like(e)
    missing = e.new_empty(0, e.shape[2])
    xs, gxs, es, gs, ges = numpy_views(x if x is not None else missing, grad_x if grad_x is not None else missing, e, grad, grad_e)
    split_over_threads(e.shape[0], lambda a, b: _backward(xs, es, gs, gxs, ges, x is not None, int(self_interaction), a, b), threads, MIN_SAMPLES_PER_THREAD)
    return grad_x, grad_e
