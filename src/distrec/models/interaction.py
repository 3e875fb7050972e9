"""Feature interactions: DLRM's pairwise dot products, concatenation, and DCN-v2's CrossNet."""

from __future__ import annotations

import torch
from torch import nn

from distrec.kernels import compiled, runs_compiled


def pair_positions(num_vectors: int, self_interaction: bool, device: torch.device | str | None = None) -> torch.Tensor:
    """Flat positions ``i * N + j`` of the pairs i < j (i <= j with self-pairs) of an N x N Gram matrix.

    Example:
        >>> pair_positions(3, self_interaction=False)
        tensor([1, 2, 5])
    """
    rows, cols = torch.triu_indices(num_vectors, num_vectors, offset=0 if self_interaction else 1, device=device)
    return rows * num_vectors + cols


def symmetric_pair_map(num_vectors: int, self_interaction: bool, device: torch.device | str | None = None) -> torch.Tensor:
    """For each flat position ``i * N + j`` of an N x N matrix, the index of pair (i, j) or (j, i).

    Indices follow ``pair_positions``; positions without a pair (the diagonal, without
    self-pairs) get the pair count P, so gathering from P + 1 columns whose last is zero
    builds the symmetric matrix of pair values.

    Example:
        >>> symmetric_pair_map(3, self_interaction=False)
        tensor([3, 0, 1, 0, 3, 2, 1, 2, 3])
    """
    rows, cols = torch.triu_indices(num_vectors, num_vectors, offset=0 if self_interaction else 1, device=device)
    pair = torch.arange(rows.numel(), device=device)
    index = torch.full((num_vectors, num_vectors), rows.numel(), dtype=torch.int64, device=device)
    index[rows, cols] = pair
    index[cols, rows] = pair
    return index.view(-1)


def interacts_by_kernels(x: torch.Tensor | None, e: torch.Tensor) -> bool:
    """Whether the dot interaction of ``x`` and ``e`` runs in ``distrec.kernels.interaction``
    (float32 or float64 tensors of one dtype that the compiled kernels take: ``runs_compiled``);
    elsewhere it runs in torch operators."""
    tensors = [e] if x is None else [x, e]
    return runs_compiled(*tensors) and all(t.dtype in (torch.float32, torch.float64) and t.dtype == e.dtype for t in tensors)


class _DotInteraction(torch.autograd.Function):
    """``[x, pairwise dots of (x, e_1, ..., e_F)]`` with a hand-written backward.

    The dense vector x is kept apart from the sparse vectors e (no [B, F + 1, D] copy):
    dots among e come from one batched product e e^T, dots of x with e from e x. The
    output columns are x, then (x.x with self-pairs), then x.e_j, then e_i.e_j (i < j or
    i <= j), the row-major upper-triangle order of the pairs of (x, e_1, ..., e_F).
    The backward gathers the e.e gradients into a symmetric matrix S per sample (one
    index_select) and returns de = S e + g_xe x^T and dx = g_x + e^T g_xe (+ 2 g_xx x), all
    contiguous; autograd's own graph for bmm + indexing is several times slower on CPU.
    On the CPU both directions run in ``distrec.kernels.interaction`` instead, which computes
    only the kept pairs, sample by sample (``interacts_by_kernels``).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor | None, e: torch.Tensor, positions: torch.Tensor, pair_map: torch.Tensor, self_interaction: bool) -> torch.Tensor:
        ctx.self_interaction = self_interaction
        ctx.num_pairs = positions.numel()
        ctx.by_kernels = interacts_by_kernels(x, e)
        if ctx.by_kernels:
            x, e = (x.contiguous() if x is not None else None), e.contiguous()
        ctx.save_for_backward(x, e, pair_map)
        if ctx.by_kernels:
            return compiled("interaction").dot_interaction(x, e, self_interaction)
        batch_size, num_sparse, _ = e.shape
        sparse_dots = torch.bmm(e, e.transpose(1, 2)).view(batch_size, num_sparse * num_sparse).index_select(1, positions)
        if x is None:
            return sparse_dots
        parts = [x, (x * x).sum(1, keepdim=True)] if self_interaction else [x]
        return torch.cat([*parts, torch.bmm(e, x.unsqueeze(2)).view(batch_size, num_sparse), sparse_dots], dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, None, None, None]:
        x, e, pair_map = ctx.saved_tensors
        if ctx.by_kernels:
            grad_x, grad_e = compiled("interaction").dot_interaction_backward(x, e, grad.contiguous(), ctx.self_interaction)
            return grad_x, grad_e, None, None, None
        batch_size, num_sparse, dim = e.shape
        padded = torch.cat([grad[:, grad.shape[1] - ctx.num_pairs :], grad.new_zeros(batch_size, 1)], dim=1)
        symmetric = padded.index_select(1, pair_map).view(batch_size, num_sparse, num_sparse)
        if ctx.self_interaction:
            # d(e_i . e_i) / de_i = 2 e_i
            symmetric.diagonal(dim1=1, dim2=2).mul_(2.0)
        # d(e_i . e_j) / de_i = e_j and vice versa
        grad_e = torch.bmm(symmetric, e)
        if x is None:
            return None, grad_e, None, None, None
        self_pair = int(ctx.self_interaction)
        grad_xe = grad[:, dim + self_pair : dim + self_pair + num_sparse]
        grad_e.addcmul_(grad_xe.unsqueeze(2), x.unsqueeze(1))
        grad_x = torch.bmm(grad_xe.unsqueeze(1), e).view(batch_size, dim).add_(grad[:, :dim])
        if self_pair:
            grad_x.addcmul_(grad[:, dim : dim + 1], x, value=2.0)
        return grad_x, grad_e, None, None, None


class DotInteraction(nn.Module):
    """DLRM's interaction: the dense vector followed by all pairwise dot products.

    Input: ``dense`` [B, D] (or None when the data has no dense features) and ``sparse``
    [B, F, D]. Output: [B, D + P] with P = N (N - 1) / 2 pairs of the N = F + 1 vectors
    (N (N + 1) / 2 with self-pairs), or [B, P] over the F sparse vectors without ``dense``.
    Pairs are in row-major upper-triangle order of (dense, sparse_1, ..., sparse_F).

    Example:
        >>> DotInteraction(num_sparse=26)(x, e).shape   # x [B, 64], e [B, 26, 64]
        torch.Size([B, 415])
    """

    def __init__(self, num_sparse: int, has_dense: bool = True, self_interaction: bool = False) -> None:
        super().__init__()
        self.num_sparse = num_sparse
        self.has_dense = has_dense
        self.self_interaction = self_interaction
        self.register_buffer("positions", pair_positions(num_sparse, self_interaction), persistent=False)
        self.register_buffer("pair_map", symmetric_pair_map(num_sparse, self_interaction), persistent=False)

    def output_width(self, dim: int) -> int:
        """Width of the output for vectors of ``dim`` floats."""
        n = self.num_sparse + int(self.has_dense)
        pairs = n * (n + 1) // 2 if self.self_interaction else n * (n - 1) // 2
        return pairs + (dim if self.has_dense else 0)

    def forward(self, dense: torch.Tensor | None, sparse: torch.Tensor) -> torch.Tensor:
        if (dense is not None) != self.has_dense or sparse.shape[1] != self.num_sparse:
            raise ValueError(
                f"DotInteraction built for {self.num_sparse} sparse vectors (dense: {self.has_dense}) "
                f"got sparse {tuple(sparse.shape)} and dense {dense is not None}"
            )
        return _DotInteraction.apply(dense, sparse, self.positions, self.pair_map, self.self_interaction)


class CatInteraction(nn.Module):
    """Concatenation: the dense vector (if any) followed by the flattened sparse vectors."""

    def forward(self, dense: torch.Tensor | None, sparse: torch.Tensor) -> torch.Tensor:
        flat = sparse.flatten(1)
        return flat if dense is None else torch.cat([dense, flat], dim=1)


class CrossNet(nn.Module):
    """DCN-v2's cross network: ``x_{l+1} = x0 * (W_l x_l + b_l) + x_l`` for each layer l.

    ``W_l`` is a full [width, width] matrix, or with ``low_rank = r > 0`` the product
    ``U_l V_l^T`` of two [width, r] matrices (Wang et al., DCN V2, WWW 2021, eq. 1 and 2).

    Example:
        >>> CrossNet(width=429, num_layers=3)(x0).shape   # x0 [B, 429]
        torch.Size([B, 429])
    """

    def __init__(self, width: int, num_layers: int, low_rank: int = 0, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.projections = nn.ModuleList(_cross_projection(width, low_rank, device) for _ in range(num_layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for projection in self.projections:
            x = torch.addcmul(x, x0, projection(x))
        return x


def _cross_projection(width: int, low_rank: int, device: torch.device | str | None) -> nn.Module:
    """``x -> W x + b``, with W full rank or factored as U V^T of rank ``low_rank``."""
    if low_rank <= 0:
        return nn.Linear(width, width, device=device)
    return nn.Sequential(nn.Linear(width, low_rank, bias=False, device=device), nn.Linear(low_rank, width, device=device))
