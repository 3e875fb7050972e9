"""DLRM's dot interaction, forward and backward per sample, compiled by numba.

In torch operators the interaction of F sparse vectors is a batched product of [F, D] by
[D, F] matrices (all F^2 dots, where F (F - 1) / 2 are kept), an ``index_select`` of the
kept pairs and a ``cat`` with the dense vector; its backward gathers the pair gradients into
a symmetric [F, F] matrix per sample and multiplies again. Batched products of matrices this
small run far below the CPU's peak (benchmarks/results/2026-11-27-cpu-kernels.md). Here, per sample, with
v = (x, e_1, ..., e_F) the N vectors that interact:

- the forward computes only the kept dots, each vectorised over D, straight into the
  output row;
- the backward puts the pair gradients into the symmetric [N, N] matrix S (on the stack)
  and forms each vector's gradient ``dv_i = sum_k S[i, k] v_k`` in registers (one pass over
  the N vectors per i, no read-modify-write of the gradient rows).

Both are compiled per shape (N, D, with or without x and self-pairs; cached on disk by
numba), so the loops over D have a constant length and unroll. Samples are independent, so
results do not depend on how the batch is split over threads; the dot products add their D
terms in an order of the compiler's choosing (vectorised), so they match the torch operators
to rounding, not bit for bit (``tests/test_kernels_interaction.py``). CPU tensors only
(NumPy views share their memory), float32 or float64.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
import torch

from distrec.kernels.accumulators import stack_vector
from distrec.kernels.rows import numpy_views, split_over_threads

MIN_SAMPLES_PER_THREAD = 256
"""Below this many samples per thread one thread does all (a sample takes a few microseconds)."""


@functools.cache
def _forward_kernel(num_sparse: int, dim: int, has_dense: bool, self_pair: bool):
    """The forward for ``num_sparse`` vectors of ``dim`` floats (and x when ``has_dense``)."""
    dense = int(has_dense)
    first_partner = 1 - int(self_pair)  # pairs (i, j) with j >= i + first_partner
    vectors = num_sparse + dense

    @numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
    def forward(x, e, out, start, end):  # pragma: no cover - compiled
        """Rows [start, end) of ``out``: x, then the kept dots in row-major upper-triangle order."""
        zero = np.zeros(1, out.dtype)[0]
        for b in range(start, end):
            for d in range(dim if dense else 0):
                out[b, d] = x[b, d]
            c = dim * dense
            for i in range(vectors):
                left = x[b] if dense and i == 0 else e[b, i - dense]
                for j in range(i + first_partner, vectors):
                    right = x[b] if dense and j == 0 else e[b, j - dense]
                    total = zero
                    for d in range(dim):
                        total += left[d] * right[d]
                    out[b, c] = total
                    c += 1

    return forward


@functools.cache
def _backward_kernel(num_sparse: int, dim: int, has_dense: bool, self_pair: bool):
    """The backward for ``_forward_kernel``'s shape."""
    dense = int(has_dense)
    vectors = num_sparse + dense
    cells = vectors * vectors

    @numba.njit(nogil=True, cache=True, fastmath={"contract"})
    def backward(x, e, grad, grad_x, grad_e, start, end):  # pragma: no cover - compiled
        """Rows [start, end) of ``grad_x`` and ``grad_e`` from the output gradient ``grad``."""
        pair_grad = stack_vector(cells, grad)  # S, row-major
        total = stack_vector(dim, grad)
        for b in range(start, end):
            first = x[b] if dense else e[b, 0]  # v_0
            c = dim * dense
            for i in range(vectors):
                if self_pair:  # d(v_i . v_i) / dv_i = 2 v_i
                    pair_grad[i * vectors + i] = grad[b, c] + grad[b, c]
                    c += 1
                else:
                    pair_grad[i * vectors + i] = 0
                for j in range(i + 1, vectors):
                    pair_grad[i * vectors + j] = grad[b, c]
                    pair_grad[j * vectors + i] = grad[b, c]
                    c += 1
            for i in range(vectors):
                s = pair_grad[i * vectors]
                for d in range(dim):
                    total[d] = s * first[d]
                for k in range(1, vectors):
                    s = pair_grad[i * vectors + k]
                    for d in range(dim):
                        total[d] += s * e[b, k - dense, d]
                if dense and i == 0:  # x also reaches the output as itself
                    for d in range(dim):
                        grad_x[b, d] = total[d] + grad[b, d]
                else:
                    for d in range(dim):
                        grad_e[b, i - dense, d] = total[d]

    return backward


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
    kernel = _forward_kernel(num_sparse, dim, x is not None, self_interaction)
    split_over_threads(batch_size, lambda a, b: kernel(xs, es, outs, a, b), threads, MIN_SAMPLES_PER_THREAD)
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
    kernel = _backward_kernel(e.shape[1], e.shape[2], x is not None, self_interaction)
    split_over_threads(e.shape[0], lambda a, b: kernel(xs, es, gs, gxs, ges, a, b), threads, MIN_SAMPLES_PER_THREAD)
    return grad_x, grad_e
