"""Sum-pooled embedding bags for all sparse features, fused into one table and one lookup."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from distrec.allocator import empty_table
from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.kernels import compiled, runs_compiled
from distrec.models.table_init import TableInit
from distrec.table_dtype import is_half, table_parameter
from distrec.tables import TableConfig


class Bags(NamedTuple):
    """Bags of fused-table rows in sample-major order (bag ``b * F + f``).

    Attributes:
        rows: int64 [nnz] fused-table rows.
        offsets: int64 [B * F + 1] bag boundaries into ``rows``.
        bag_of_row: int64 [nnz] the bag of each row, or None when every bag holds exactly one row.
    """

    rows: torch.Tensor
    offsets: torch.Tensor
    bag_of_row: torch.Tensor | None


def sample_major(values: torch.Tensor, offsets: torch.Tensor, row_offsets: torch.Tensor, one_per_bag: bool | None = None) -> Bags:
    """Reorder a feature-major jagged batch into sample-major bags of fused-table rows.

    Pooling the result yields [B, F, D] directly, without a transpose of the output.

    Args:
        values: int64 [nnz] row indices, feature-major (see ``Batch``).
        offsets: int64 [F * B + 1] bag boundaries, bag ``f * B + b`` for feature f, sample b.
        row_offsets: int64 [F] first row of each feature's table in the fused table.
        one_per_bag: whether every bag holds one index, when known on the host (None: read the
            lengths, a device sync on a GPU).

    Returns:
        ``Bags``: int64 [nnz] fused-table rows, int64 [B * F + 1] boundaries of bag
        ``b * F + f``, and the bag of each row (None when every bag has one row).

    Example:
        >>> sample_major(torch.tensor([1, 2, 0]), torch.tensor([0, 1, 2, 3]), torch.tensor([10]))[:2]
        (tensor([11, 12, 10]), tensor([0, 1, 2, 3]))
    """
    num_features = row_offsets.numel()
    num_bags = offsets.numel() - 1
    batch_size = num_bags // num_features
    lengths = torch.diff(offsets).view(num_features, batch_size).t().reshape(-1)
    bag_offsets = torch.zeros(num_bags + 1, dtype=torch.int64, device=values.device)
    torch.cumsum(lengths, 0, out=bag_offsets[1:])
    nnz = values.numel()
    if nnz == num_bags and (one_per_bag if one_per_bag is not None else bool(torch.all(lengths == 1))):
        # one index per bag (single-hot features): the reorder is a transpose
        rows = values.view(num_features, batch_size) + row_offsets.unsqueeze(1)
        return Bags(rows.t().reshape(-1), bag_offsets, None)
    # each output position's source is its bag's old start plus its rank within the bag
    bag = torch.repeat_interleave(torch.arange(num_bags, device=values.device), lengths, output_size=nnz)
    shift = offsets[:-1].view(num_features, batch_size).t().reshape(-1) - bag_offsets[:-1]
    source = shift[bag] + torch.arange(nnz, device=values.device)
    return Bags(values[source] + row_offsets.repeat(batch_size)[bag], bag_offsets, bag)


def bags_of_rows(rows: torch.Tensor, offsets: torch.Tensor) -> Bags:
    """``Bags`` of ``rows`` int64 [nnz] cut at ``offsets`` int64 [bags + 1] (any bag order),
    with the bag of each row (None when every bag holds exactly one row).

    Example:
        >>> bags_of_rows(torch.tensor([4, 7, 2]), torch.tensor([0, 2, 3])).bag_of_row
        tensor([0, 0, 1])
    """
    num_bags = offsets.numel() - 1
    lengths = torch.diff(offsets)
    if rows.numel() == num_bags and bool(torch.all(lengths == 1)):
        return Bags(rows, offsets, None)
    bag = torch.repeat_interleave(torch.arange(num_bags, device=rows.device), lengths, output_size=rows.numel())
    return Bags(rows, offsets, bag)


def feature_major(values: torch.Tensor, offsets: torch.Tensor, row_offsets: torch.Tensor) -> Bags:
    """A feature-major jagged batch as bags of fused-table rows, in the batch's own order.

    Unlike ``sample_major`` nothing is reordered: each feature's indices are shifted to its
    table's rows, and pooling yields [F * B, D] (bag ``f * B + b``), which a transpose of the
    pooled vectors (B * F of them, not one per index) turns into [B, F, D].

    Args:
        values: int64 [nnz] row indices, feature-major (see ``Batch``).
        offsets: int64 [F * B + 1] bag boundaries, bag ``f * B + b`` for feature f, sample b.
        row_offsets: int64 [F] first row of each feature's table in the fused table.

    Example:
        >>> feature_major(torch.tensor([1, 2, 0]), torch.tensor([0, 2, 3]), torch.tensor([10]))[0]
        tensor([11, 12, 10])
    """
    num_features = row_offsets.numel()
    batch_size = (offsets.numel() - 1) // num_features
    per_feature = torch.diff(offsets[::batch_size]) if batch_size else offsets.new_zeros(num_features)
    rows = values + torch.repeat_interleave(row_offsets, per_feature, output_size=values.numel())
    return bags_of_rows(rows, offsets)


def group_by_row(rows: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group entries by row: entry k belongs to row ``rows[k]`` (in [0, num_rows)).

    Returns:
        The distinct rows, sorted, int64 [U]; int64 [U + 1] bounds of each row's range of
        the third result; int64 [nnz] entries in row order (the entries of distinct row u
        are ``order[bounds[u]:bounds[u + 1]]``, in increasing order).

    Example:
        >>> group_by_row(torch.tensor([5, 2, 5]), num_rows=6)
        (tensor([2, 5]), tensor([0, 1, 3]), tensor([1, 0, 2]))
    """
    # 32-bit keys sort about twice as fast as 64-bit ones on CPU; the sort is stable, so each
    # row's entries stay in order
    keys = rows.to(torch.int32) if num_rows <= torch.iinfo(torch.int32).max else rows
    sorted_keys, order = torch.sort(keys, stable=True)
    unique, counts = torch.unique_consecutive(sorted_keys, return_counts=True)
    bounds = torch.zeros(unique.numel() + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(counts, 0, out=bounds[1:])
    return unique.long(), bounds, order


def sum_by_row(rows: torch.Tensor, source: torch.Tensor, num_rows: int, source_of_entry: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Group entries by row and sum their vectors: the coalescing of a sparse row gradient.

    Entry k belongs to row ``rows[k]`` (in [0, num_rows)) and carries
    ``source[source_of_entry[k]]`` (or ``source[k]`` when ``source_of_entry`` is None).

    Returns:
        The distinct rows, sorted, int64 [U], and the summed vector of each, [U, D].

    Example:
        >>> sum_by_row(torch.tensor([5, 2, 5]), torch.tensor([[1.0], [2.0], [4.0]]), num_rows=6)
        (tensor([2, 5]), tensor([[2.], [5.]]))
    """
    unique, bounds, order = group_by_row(rows, num_rows)
    picks = order if source_of_entry is None else source_of_entry[order]
    # a sum over each row's entries is a sum pooling of bags: embedding_bag's kernel does it
    # faster on CPU than Tensor.coalesce() or unique + index_add_
    return unique, F.embedding_bag(picks, source, bounds, mode="sum", include_last_offset=True)


class RowUpdate(Protocol):
    """An optimizer step on a weight's rows, from their gradient entries (see ``update_rows_in_backward``)."""

    def __call__(self, rows: torch.Tensor, bounds: torch.Tensor, picks: torch.Tensor, grad: torch.Tensor) -> None:
        """Update distinct rows int64 [U] of the weight; row u's gradient is the sum of
        ``grad[picks[k]]`` [*, D] for k in [bounds[u], bounds[u + 1])."""
        ...


ROW_UPDATE = "update_rows_in_backward"
"""The attribute of a weight holding its ``RowUpdate`` while the update is applied in backward."""


def update_rows_in_backward(weight: nn.Parameter, update: RowUpdate | None) -> None:
    """Have ``pool_sum``'s backward apply ``update`` to ``weight``'s looked-up rows instead of
    making its gradient (the optimizer step fused into backward, as FBGEMM's kernels do:
    no [rows, D] gradient is ever made); None makes gradients again.

    Only for a weight whose gradient nothing else reads between backward and the optimizer
    step (no all-reduce of its rows, no gradient accumulated over several backward passes).
    """
    if update is None:
        if hasattr(weight, ROW_UPDATE):
            delattr(weight, ROW_UPDATE)
    else:
        setattr(weight, ROW_UPDATE, update)


def row_update_in_backward(weight: nn.Parameter) -> RowUpdate | None:
    """The update ``update_rows_in_backward`` gave ``weight``, or None (it gets gradients)."""
    return getattr(weight, ROW_UPDATE, None)


def _update_or_gradient(ctx, rows: torch.Tensor, bounds: torch.Tensor, picks: torch.Tensor, grad: torch.Tensor) -> torch.Tensor | None:
    """The end of a pooling's backward from its lookups grouped by row (``RowUpdate``'s
    arguments): apply the weight's in-backward update (``ctx.update``) and return None, or
    return the coalesced sparse gradient of the weight (``ctx.weight_shape``)."""
    if ctx.update is not None:
        ctx.update(rows, bounds, picks, grad)
        return None
    # a sum over each row's entries is a sum pooling of bags: embedding_bag's kernel does it
    values = F.embedding_bag(picks, grad, bounds, mode="sum", include_last_offset=True)
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values, ctx.weight_shape, check_invariants=False, is_coalesced=True)


def bag_sums(weight: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The sum of each bag's ``rows`` of ``weight`` [rows, D], bags cut at ``offsets``
    [bags + 1] (last included): float32 [bags, D], also for a half-precision weight (each bag
    summed in float32 by ``embedding_bag``, rounded once to the weight's dtype). No gradient."""
    pooled = F.embedding_bag(rows, weight, offsets, mode="sum", include_last_offset=True)
    return pooled.float() if is_half(weight) else pooled


class _SumPooling(torch.autograd.Function):
    """Sum pooling of bags of weight rows whose backward yields a sparse COO gradient.

    With one row per bag (single-hot features) the gradient has one entry per lookup, the
    output gradient itself (no copy, uncoalesced). With multi-row bags it is coalesced
    right away (one entry per distinct row), which is smaller than one entry per lookup
    and is what the row-wise optimizers need anyway. A weight with a ``RowUpdate``
    (``update_rows_in_backward``) gets no gradient: its rows are updated from the grouped
    output gradient instead.

    A half-precision weight (fp16, bf16) pools into float32 sums (each bag summed in float32 by
    ``embedding_bag``, then rounded once to the weight's dtype on its way out) and gets float32
    gradients.
    """

    @staticmethod
    def forward(ctx, weight: torch.Tensor, bags: Bags) -> torch.Tensor:
        ctx.bags = bags
        ctx.weight_shape = weight.shape
        ctx.update = getattr(weight, ROW_UPDATE, None)
        return bag_sums(weight, bags.rows, bags.offsets)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        bags: Bags = ctx.bags
        grad = grad.contiguous()
        if ctx.update is None and bags.bag_of_row is None:  # one entry per lookup: the output gradient itself
            return torch.sparse_coo_tensor(bags.rows.unsqueeze(0), grad, ctx.weight_shape, check_invariants=False), None
        rows, bounds, order = group_by_row(bags.rows, ctx.weight_shape[0])
        return _update_or_gradient(ctx, rows, bounds, order if bags.bag_of_row is None else bags.bag_of_row[order], grad), None


class _SegmentPooling(torch.autograd.Function):
    """``pool_sum`` of bags given as ``distrec.kernels.bags.Segments``, by the compiled kernels:
    the same results, gradient and in-backward update, without the shifted rows, the bag of each
    row or a transpose of the pooled vectors."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, segments) -> torch.Tensor:
        ctx.segments = segments
        ctx.weight_shape = weight.shape
        ctx.update = getattr(weight, ROW_UPDATE, None)
        return compiled("bags").pool(weight, segments)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        grad = grad.contiguous()
        return _update_or_gradient(ctx, *compiled("bags").group(ctx.segments), grad), None


def pool_segments(weight: torch.Tensor, segments) -> torch.Tensor:
    """``pool_sum`` for float32 CPU weights, of bags in segments (``distrec.kernels.bags.Segments``):
    [segments.num_out, D]. Raises ``distrec.kernels.bags.IndexOutsideTable``."""
    return _SegmentPooling.apply(weight, segments)


def pools_by_kernels(weight: torch.Tensor) -> bool:
    """Whether multi-hot bags of ``weight`` pool through ``pool_segments`` (float32 weights the
    compiled kernels take: ``distrec.kernels.runs_compiled``)."""
    return weight.dtype == torch.float32 and runs_compiled(weight)


def pool_sum(weight: torch.Tensor, bags: Bags) -> torch.Tensor:
    """Sum of each bag's rows of ``weight`` [rows, D]: [bags, D] (float32 for a half-precision
    weight, whose gradient is float32 too). The gradient of ``weight``
    is sparse COO (one entry per lookup for single-row bags, else one per distinct row), or
    none when its rows are updated in backward (``update_rows_in_backward``)."""
    return _SumPooling.apply(weight, bags)


class EmbeddingBagCollection(nn.Module):
    """One sum-pooled embedding table per sparse feature, stored as a single fused weight.

    All tables live in one parameter ``weight`` [sum of rows, D], stacked in the order of
    ``tables`` (the Batch's feature order); ``table_rows(name)`` gives a table's row range
    and ``table_weight(name)`` a view of it. One ``embedding_bag`` call pools every feature, and the gradient of ``weight``
    is a sparse COO tensor holding only the looked-up rows (one entry per lookup for
    single-hot batches, one per distinct row for multi-hot ones, pooled in the batch's
    feature-major order), so no dense table-sized gradient is ever made. Gradients of several backward
    passes before one optimizer step accumulate (their entries are concatenated).

    Rows are initialised uniformly in +-sqrt(1 / num_rows), as in the DLRM reference code,
    from a seed drawn from torch's global generator (``initializer``, a ``TableInit``: it
    makes any part of the tables alone, so a sharded model made from it starts where this
    one does without ever holding whole tables).

    Args:
        tables: one TableConfig per sparse feature, all with the same ``dim``.
        device: where to allocate the weight (default: ``weight``'s device, else the host).
        weight: the rows to use as they are, [sum of rows, D] (any strides, e.g. a memory
            map of a saved table larger than RAM), instead of allocating and initialising them.
        dtype: how new rows are stored: float32, or float16 / bfloat16 (half the memory; the
            pooled vectors and the gradients stay float32, see ``distrec.table_dtype``).

    Example:
        >>> ebc = EmbeddingBagCollection([TableConfig("a", 10, 4), TableConfig("b", 5, 4)])
        >>> ebc(batch).shape                 # batch with 2 sparse features, B samples
        torch.Size([B, 2, 4])
        >>> ebc.table_weight("b").shape      # a view into the fused weight
        torch.Size([5, 4])
    """

    def __init__(
        self, tables: list[TableConfig], device: torch.device | str | None = None, weight: torch.Tensor | None = None, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        if not tables:
            raise DistrecError("the model has no embedding tables; the data must have at least one sparse feature")
        dims = sorted({t.dim for t in tables})
        if len(dims) > 1:
            raise DistrecError(f"embedding tables have dimensions {dims}; give every table the same dim (model.embedding_dim)")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise DistrecError(f"embedding table names repeat in {names}; give every sparse feature a unique name")
        self.tables = list(tables)
        self.table_sizes = tuple(t.num_rows for t in tables)
        self.dim = dims[0]
        starts = [0]
        for t in tables:
            starts.append(starts[-1] + t.num_rows)
        self._row_range = {t.name: (starts[i], starts[i + 1]) for i, t in enumerate(tables)}
        if weight is not None and tuple(weight.shape) != (starts[-1], self.dim):
            raise DistrecError(
                f"embedding rows of shape {tuple(weight.shape)} do not fit tables of {starts[-1]} rows of dim {self.dim}; use the rows saved with these tables"
            )
        device = device if device is not None or weight is None else weight.device
        self.register_buffer("row_offsets", torch.tensor(starts[:-1], dtype=torch.int64, device=device), persistent=False)
        self.register_buffer("table_num_rows", torch.tensor([t.num_rows for t in tables], dtype=torch.int64, device=device), persistent=False)
        self.weight = table_parameter(empty_table(starts[-1], self.dim, device, dtype) if weight is None else weight.to(device))
        self.reset_parameters(fill=weight is None)

    @property
    def num_features(self) -> int:
        return len(self.tables)

    @property
    def num_vectors(self) -> int:
        """Pooled vectors per sample: one per feature."""
        return len(self.tables)

    def reset_parameters(self, fill: bool = True) -> None:
        """Uniform in +-sqrt(1 / num_rows) per table (DLRM reference initialisation), from a
        new seed drawn from torch's global generator (one draw, whatever the table sizes);
        with ``fill`` False only the seed is drawn (``initializer``), the rows are kept."""
        self.initializer = TableInit(self.tables, int(torch.randint(2**62, ())))
        if fill:
            for i, t in enumerate(self.tables):
                self.initializer.fill(self.table_weight(t.name), i)

    def table_rows(self, name: str) -> tuple[int, int]:
        """The fused-weight rows [start, end) holding table ``name``."""
        try:
            return self._row_range[name]
        except KeyError:
            raise KeyError(f"no embedding table {name!r}; tables are {list(self._row_range)}") from None

    def table_weight(self, name: str) -> torch.Tensor:
        """Table ``name`` as a [num_rows, D] view of the fused weight (writes go through)."""
        start, end = self.table_rows(name)
        return self.weight[start:end]

    def table_weights(self) -> dict[str, torch.Tensor]:
        """Every table as a detached ``table_weight`` view: {name: [num_rows, D]}."""
        return {t.name: self.table_weight(t.name).detach() for t in self.tables}

    def forward(self, batch: Batch) -> torch.Tensor:
        """Pooled embeddings of every feature: float32 [B, F, D], contiguous."""
        if batch.num_features != self.num_features:
            raise DistrecError(
                f"the batch has {batch.num_features} sparse features but the model has {self.num_features} tables; use the tables of the same data set"
            )
        shape = (batch.batch_size, self.num_features, self.dim)
        single_hot = batch.sparse_values.numel() == batch.batch_size * self.num_features
        if not single_hot and pools_by_kernels(self.weight):  # the kernels check the indices as they go
            kernels = compiled("bags")
            segments = kernels.feature_segments(batch.sparse_values, batch.sparse_offsets, self.row_offsets, self.table_num_rows)
            try:
                return pool_segments(self.weight, segments).view(shape)
            except kernels.IndexOutsideTable:
                self._check_indices(batch)
                raise
        if not batch.checked_within(self.table_sizes):  # the loader checked them on the host
            self._check_indices(batch)
        if single_hot:  # reorder the indices
            one_per_bag = batch.layout.one_per_bag if batch.layout is not None else None
            bags = sample_major(batch.sparse_values, batch.sparse_offsets, self.row_offsets, one_per_bag)
            if bags.bag_of_row is None:
                return pool_sum(self.weight, bags).view(shape)
        # multi-hot: pool in the batch's feature-major order, then transpose the pooled vectors
        bags = feature_major(batch.sparse_values, batch.sparse_offsets, self.row_offsets)
        pooled = pool_sum(self.weight, bags).view(self.num_features, batch.batch_size, self.dim)
        return pooled.transpose(0, 1).contiguous()

    def _check_indices(self, batch: Batch) -> None:
        """Raise DistrecError if an index falls outside its own table (it would hit a neighbour)."""
        if batch.sparse_values.numel() == batch.batch_size * self.num_features:  # single-hot: one comparison per index
            values = batch.sparse_values.view(self.num_features, batch.batch_size)
            if not bool(((values < 0) | (values >= self.table_num_rows.unsqueeze(1))).any()):
                return
        bounds = batch.sparse_offsets[:: batch.batch_size].tolist()
        spans = [(f, a, b) for f, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])) if b > a]
        if not spans:
            return
        extremes = torch.stack([torch.stack(torch.aminmax(batch.sparse_values[a:b])) for _, a, b in spans]).tolist()
        for (f, _, _), (low, high) in zip(spans, extremes):
            t = self.tables[f]
            if low < 0 or high >= t.num_rows:
                raise t.index_error(low if low < 0 else high)

    def extra_repr(self) -> str:
        stored = "" if self.weight.dtype == torch.float32 else f", dtype={self.weight.dtype}"
        return f"tables={self.num_features}, rows={self.weight.shape[0]}, dim={self.dim}{stored}"
