"""Embedding tables sharded across ranks, looked up through all-to-all exchanges.

Forward, on every rank (TorchRec's sparse data dist -> lookup -> embedding dist):

1. input all-to-all: each rank sends, for every lookup unit (a table-, column- or row-wise
   shard), the bags of that unit's feature for its own samples to the unit's owner
   (row-wise units get only the indices inside their row range, shifted to local rows):
   the split counts first, then the bag lengths and indices in one message, as int32 when
   every table's rows fit;
2. lookup: each owner pools all bags it received with one ``embedding_bag`` per shard width
   over a fused weight of its shards (sparse gradients, like the unsharded module);
3. output all-to-all: pooled vectors return to the ranks that own the samples, which place
   column shards side by side and sum row-wise partial sums, giving [B_local, F, D].

Backward runs the output all-to-all in reverse (gradients go to the owners), so owners apply
ordinary sparse optimizer updates to their shards. Data-parallel tables are replicated and
looked up locally; :meth:`ShardedEmbeddingBagCollection.sync_replica_grads` averages their
sparse gradients across ranks before the optimizer step.

Gradient scale: every rank's loss is normalised so that the dense gradients averaged by
DistributedDataParallel equal the single-process gradients; an owner therefore receives
``world_size`` times the true gradient and the backward exchange scales it by 1/world_size.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distrec.allocator import empty_table
from distrec.components.exchange import ExchangeStats
from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.kernels import compiled
from distrec.models.embedding import bags_of_rows, pool_segments, pool_sum, pools_by_kernels
from distrec.models.table_init import TableInit
from distrec.parallel.comm import all_to_all, differentiable_all_to_all
from distrec.parallel.plan import ShardingPlan
from distrec.parallel.sparse_grads import average_sparse_grads
from distrec.table_dtype import is_half, table_parameter
from distrec.tables import TableConfig, exchanged_index_bytes

TableFill = Callable[[torch.Tensor, int, int, int], None]
"""``fill(out, table, row_start, col_start)``: write that block of table number ``table`` into ``out``."""


def full_weights_fill(tables: list[TableConfig], full: dict[str, torch.Tensor]) -> TableFill:
    """A ``TableFill`` that copies blocks out of full tables (name -> [rows, dim])."""

    def fill(out: torch.Tensor, table: int, row_start: int, col_start: int) -> None:
        rows, cols = out.shape
        out.copy_(full[tables[table].name][row_start : row_start + rows, col_start : col_start + cols])

    return fill


@dataclass(frozen=True)
class LookupUnit:
    """One block of a table that answers lookups on one rank (a shard of a sharded table)."""

    feature: int
    table: str
    rank: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int
    row_wise: bool

    @property
    def width(self) -> int:
        return self.col_end - self.col_start

    @property
    def num_rows(self) -> int:
        return self.row_end - self.row_start


def lookup_units(tables: list[TableConfig], plan: ShardingPlan) -> list[LookupUnit]:
    """Every non-replicated shard of ``plan`` as a LookupUnit, ordered by (rank, feature, rows, cols)."""
    index = {t.name: i for i, t in enumerate(tables)}
    units = [
        LookupUnit(index[p.table], p.table, s.rank, s.row_start, s.row_end, s.col_start, s.col_end, p.sharding == "row_wise")
        for p in plan.tables
        if p.sharding != "data_parallel"
        for s in p.shards
    ]
    return sorted(units, key=lambda u: (u.rank, u.feature, u.row_start, u.col_start))


@dataclass(frozen=True)
class Routes:
    """The lookup units one forward exchanges: all of them, or those of some features."""

    units: list[LookupUnit]
    """Exchanged units, in the module's ``units`` order."""
    units_on: list[list[LookupUnit]]
    """Exchanged units per owning rank."""
    local: list[int]
    """Positions in the module's ``local_units`` of this rank's exchanged units."""


class ShardedEmbeddingBagCollection(nn.Module):
    """The sharded counterpart of ``distrec.models.embedding.EmbeddingBagCollection``.

    Same contract: ``forward(batch) -> float32 [B_local, F, D]`` for this rank's samples.
    Build it with :meth:`from_initializer` from the single-process model's ``initializer``
    (or :meth:`from_full_weights` from full tables), so that a sharded model starts exactly
    where the single-process one does.
    """

    def __init__(
        self,
        tables: list[TableConfig],
        plan: ShardingPlan,
        group: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        plan.validate(tables)
        dims = {t.dim for t in tables}
        if len(dims) != 1:
            raise DistrecError(f"sharded tables need one embedding dimension, got {sorted(dims)}; set model.embedding_dim for all")
        self.tables = list(tables)
        self.table_sizes = tuple(t.num_rows for t in tables)
        self.dim = dims.pop()
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if plan.world_size != self.world_size:
            raise DistrecError(
                f"the sharding plan is for {plan.world_size} ranks but {self.world_size} are running; regenerate the plan or change --nproc-per-node"
            )
        self.plan = plan
        self.units = lookup_units(tables, plan)
        self.units_on: list[list[LookupUnit]] = [[u for u in self.units if u.rank == r] for r in range(self.world_size)]
        self.local_units = self.units_on[self.rank]
        # fused local storage, one weight per shard width; unit k lives at rows base[k]..
        self.widths = sorted({u.width for u in self.local_units})
        self.unit_group: list[int] = []
        self.unit_base: list[int] = []
        group_rows = defaultdict(int)
        for u in self.local_units:
            g = self.widths.index(u.width)
            self.unit_group.append(g)
            self.unit_base.append(group_rows[g])
            group_rows[g] += u.num_rows
        self.weights = nn.ParameterList([table_parameter(empty_table(group_rows[g], w, device, dtype)) for g, w in enumerate(self.widths)])
        self.replicated = [i for i, t in enumerate(tables) if plan.placement(t.name).sharding == "data_parallel"]
        self.replicas = nn.ParameterList([table_parameter(empty_table(tables[i].num_rows, self.dim, device, dtype)) for i in self.replicated])
        self.stats = ExchangeStats()
        self.every_unit = self.routes(None)
        self.index_dtype = torch.int32 if exchanged_index_bytes(t.num_rows for t in tables) == 4 else torch.int64
        """How bags travel in the input all-to-all (lengths and local rows): int32 when every table's rows fit."""

    def routes(self, features: list[int] | None) -> Routes:
        """The units exchanged when only ``features`` (feature numbers; None: all) are looked up."""
        wanted = None if features is None else set(features)

        def keep(u: LookupUnit) -> bool:
            return wanted is None or u.feature in wanted

        return Routes(
            units=[u for u in self.units if keep(u)],
            units_on=[[u for u in units if keep(u)] for units in self.units_on],
            local=[k for k, u in enumerate(self.local_units) if keep(u)],
        )

    # --- construction ------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, fill: TableFill) -> None:
        """Fill this rank's shards and replicas: ``fill(out, table, row_start, col_start)``
        writes a block of table number ``table`` into ``out`` (``TableInit.fill``'s contract)."""
        for k, u in enumerate(self.local_units):
            base = self.unit_base[k]
            fill(self.weights[self.unit_group[k]][base : base + u.num_rows], u.feature, u.row_start, u.col_start)
        for p, i in zip(self.replicas, self.replicated):
            fill(p, i, 0, 0)

    @classmethod
    def from_initializer(cls, tables, plan, initializer: TableInit, group=None, device=None, dtype=torch.float32) -> ShardedEmbeddingBagCollection:
        """This rank's part of tables initialised by ``initializer``, made without whole tables."""
        module = cls(tables, plan, group, device, dtype)
        module.load_weights(initializer.fill)
        return module

    @classmethod
    def from_full_weights(cls, tables, plan, full, group=None, device=None, dtype=torch.float32) -> ShardedEmbeddingBagCollection:
        """This rank's part of full tables (name -> [rows, dim])."""
        module = cls(tables, plan, group, device, dtype)
        module.load_weights(full_weights_fill(tables, full))
        return module

    def local_blocks(self) -> list[tuple[LookupUnit, torch.Tensor]]:
        """(unit, view of its rows in the fused weight) for this rank's shards."""
        return [(u, self.weights[self.unit_group[k]][self.unit_base[k] : self.unit_base[k] + u.num_rows]) for k, u in enumerate(self.local_units)]

    # --- forward ------------------------------------------------------------------------
    def _bag_lengths(self, batch: Batch) -> torch.Tensor:
        """Bag lengths int64 [F, B], also of a batch without samples (whose offsets cannot tell F)."""
        if batch.batch_size == 0:
            return batch.sparse_offsets.new_zeros(len(self.tables), 0)
        return batch.lengths()

    def _send_buffer(self, batch: Batch, routes: Routes) -> tuple[torch.Tensor, list[int], list[int]]:
        """What this rank sends in the input all-to-all, in one ``index_dtype`` buffer: for
        each destination rank its bag lengths, then its indices (local rows). Also the bag
        count and the index count of each destination."""
        lengths = self._bag_lengths(batch)
        per_feature: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        pieces, bags, nnz = [], [], []
        for units in routes.units_on:
            lens, vals = [], []
            for u in units:
                if u.feature not in per_feature:
                    per_feature[u.feature] = (lengths[u.feature], batch.feature_values(u.feature))
                f_lens, f_vals = per_feature[u.feature]
                if u.row_wise:
                    inside = (f_vals >= u.row_start) & (f_vals < u.row_end)
                    bag = torch.repeat_interleave(torch.arange(f_lens.numel(), device=f_vals.device), f_lens, output_size=f_vals.numel())
                    lens.append(torch.zeros_like(f_lens).index_add_(0, bag, inside.to(f_lens.dtype)))
                    vals.append(f_vals[inside] - u.row_start)
                else:
                    lens.append(f_lens)
                    vals.append(f_vals)
            pieces += lens + vals
            bags.append(batch.batch_size * len(units))
            nnz.append(sum(v.numel() for v in vals))
        out = torch.empty(sum(bags) + sum(nnz), dtype=self.index_dtype, device=batch.sparse_values.device)
        if pieces:
            self._check_narrowing(batch)
            torch.cat(pieces, out=out)
        return out, bags, nnz

    def _check_narrowing(self, batch: Batch) -> None:
        """Raise DistrecError if an index of ``batch`` would not survive the cast to
        ``index_dtype`` (it would wrap into a valid-looking row instead of failing its
        table's range check)."""
        if self.index_dtype == torch.int64 or batch.sparse_values.numel() == 0 or batch.checked_within(self.table_sizes):
            return  # indices checked to lie in their tables, whose rows all fit the narrower type
        limit = torch.iinfo(self.index_dtype)
        low, high = (int(x) for x in torch.aminmax(batch.sparse_values))
        if low >= limit.min and high <= limit.max:
            return
        for f, table in enumerate(self.tables):
            values = batch.feature_values(f)
            bad = values[(values < limit.min) | (values > limit.max)]
            if bad.numel():
                raise table.index_error(int(bad[0]))

    @staticmethod
    def _unpack(received: torch.Tensor, bags: list[int], nnz: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Received bag lengths and indices, int64, from each source's (lengths, indices) block."""
        blocks = received.split([n for pair in zip(bags, nnz) for n in pair])
        lengths = torch.cat(blocks[0::2], out=received.new_empty(sum(bags), dtype=torch.int64))
        values = torch.cat(blocks[1::2], out=received.new_empty(sum(nnz), dtype=torch.int64))
        return lengths, values

    def _pool(self, lengths: torch.Tensor, values: torch.Tensor, source_batch: list[int], local: list[int]) -> list[torch.Tensor]:
        """Pool received bags (ordered source, unit, sample; the units ``local``, positions in
        ``local_units``) with one ``embedding_bag`` per width group.

        Returns, per width group, its bags' vectors in (source, unit, sample) order,
        [bags of the group, width]. The fused weights get sparse gradients (``pool_sum``:
        one entry per distinct row with multi-hot bags, so no per-index gradient is made).
        """
        if len(self.weights) == 1 and values.numel() != lengths.numel() and pools_by_kernels(self.weights[0]):
            return [self._pool_segments(lengths, values, source_batch, local)]
        device = values.device
        # unit (position in local_units) of every received bag
        units = torch.tensor(local, dtype=torch.int64, device=device)
        unit_of_bag = torch.cat([units.repeat_interleave(b) for b in source_batch])
        base = torch.tensor(self.unit_base, device=device, dtype=values.dtype)
        group_of_unit = torch.tensor(self.unit_group, device=device)
        rows = values + torch.repeat_interleave(base[unit_of_bag], lengths, output_size=values.numel())
        pooled_by_group = []
        for g, weight in enumerate(self.weights):
            if len(self.weights) == 1:
                g_rows, g_lengths = rows, lengths
            else:
                bag_mask = group_of_unit[unit_of_bag] == g
                value_mask = torch.repeat_interleave(bag_mask, lengths, output_size=values.numel())
                g_rows = rows[value_mask]
                g_lengths = lengths[bag_mask]
            g_offsets = torch.zeros(g_lengths.numel() + 1, dtype=torch.int64, device=device)
            torch.cumsum(g_lengths, 0, out=g_offsets[1:])
            pooled_by_group.append(pool_sum(weight, bags_of_rows(g_rows, g_offsets)))
        return pooled_by_group

    def _pool_segments(self, lengths: torch.Tensor, values: torch.Tensor, source_batch: list[int], local: list[int]) -> torch.Tensor:
        """``_pool`` of multi-hot bags into one fused weight, by the bag kernels (``pool_segments``):
        each (source, unit) run of bags is a segment of that unit's rows."""
        n_local = len(local)
        kernels = compiled("bags")
        bag_start = torch.zeros(len(source_batch) * n_local + 1, dtype=torch.int64)
        torch.cumsum(torch.tensor(source_batch, dtype=torch.int64).repeat_interleave(n_local), 0, out=bag_start[1:])
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        units = torch.tensor(local, dtype=torch.int64)
        segments = kernels.Segments(
            values,
            offsets,
            bag_start,
            table=units.repeat(len(source_batch)),
            out_start=bag_start[:-1],
            out_stride=torch.ones_like(bag_start[:-1]),
            table_base=torch.tensor(self.unit_base, dtype=torch.int64),
            table_rows=torch.tensor([u.num_rows for u in self.local_units], dtype=torch.int64),
            num_out=lengths.numel(),
        )
        try:
            return pool_segments(self.weights[0], segments)
        except kernels.IndexOutsideTable as bad:
            bag = int(torch.searchsorted(offsets, bad.position, right=True)) - 1
            unit = self.local_units[int(segments.table[int(torch.searchsorted(bag_start, bag, right=True)) - 1])]
            table = self.tables[unit.feature]
            raise table.index_error(int(values[bad.position])) from None

    def _lookup(self, lengths: torch.Tensor, values: torch.Tensor, source_batch: list[int], local: list[int] | None = None) -> list[list[torch.Tensor]]:
        """Pool received bags (ordered source, unit, sample; the units ``local``, positions in
        ``local_units``, default all); returns pieces[source][unit] of [B_s, width].

        The pieces come from one ``split`` per width group, whose backward assembles the
        gradient in one pass (slicing piece by piece would zero-fill the whole gradient once
        per piece).
        """
        local = self.every_unit.local if local is None else local
        pieces: list[list[torch.Tensor]] = [[None] * len(local) for _ in range(self.world_size)]  # type: ignore[list-item]
        if not local:
            return pieces
        chunks = [
            iter(pooled.split([b for b in source_batch for k in local if self.unit_group[k] == g]))
            for g, pooled in enumerate(self._pool(lengths, values, source_batch, local))
        ]
        for s in range(self.world_size):
            for j, k in enumerate(local):
                pieces[s][j] = next(chunks[self.unit_group[k]])
        return pieces

    def exchange_inputs(self, batch: Batch, routes: Routes | None = None) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Step 1, the input all-to-all: the bags every rank sends to this rank's shards (of
        ``routes``' units; default all).

        Returns the received bag lengths and indices (local rows), ordered (source, unit,
        sample), and each source's batch size. Sets ``stats`` to a fresh ExchangeStats with
        ``input_bytes`` and ``input_ms``.
        """
        t0 = time.perf_counter()
        routes = routes or self.every_unit
        b_local = batch.batch_size
        send, bags, nnz = self._send_buffer(batch, routes)
        device = batch.sparse_values.device
        # splits exchange: (batch size, index count) for every pair of ranks
        counts = torch.tensor([[b_local, n] for n in nnz], dtype=torch.int64, device=device)
        ones = [1] * self.world_size
        recv_counts = all_to_all(counts, ones, ones, self.group).tolist()
        source_batch = [int(c[0]) for c in recv_counts]
        recv_bags = [b * len(routes.local) for b in source_batch]
        recv_nnz = [int(c[1]) for c in recv_counts]
        received = all_to_all(send, [b + n for b, n in zip(recv_bags, recv_nnz)], [b + n for b, n in zip(bags, nnz)], self.group)
        recv_lengths, recv_values = self._unpack(received, recv_bags, recv_nnz)
        sent = send.numel() * send.element_size() + counts.numel() * counts.element_size()
        self.stats = ExchangeStats(input_bytes=sent, input_ms=(time.perf_counter() - t0) * 1e3)
        return recv_lengths, recv_values, source_batch

    def forward(self, batch: Batch, features: list[int] | None = None) -> torch.Tensor:
        """Pooled embeddings of this rank's samples, float32 [B_local, F, D].

        With ``features`` (the same on every rank) only those features' bags are exchanged
        and looked up; the other sharded features' vectors are zeros, which is exact when
        none of their bags holds an index (e.g. every index was answered elsewhere).
        """
        routes = self.every_unit if features is None else self.routes(features)
        b_local = batch.batch_size
        recv_lengths, recv_values, source_batch = self.exchange_inputs(batch, routes)
        t1 = time.perf_counter()
        width = sum(self.local_units[k].width for k in routes.local)
        send_splits = [b * width for b in source_batch]
        if not routes.local:  # still a graph node, so that this rank joins the backward exchange
            send = batch.dense.new_zeros(0).requires_grad_()
        elif len(self.weights) == 1:  # already in (source, unit, sample) order
            send = self._pool(recv_lengths, recv_values, source_batch, routes.local)[0].reshape(-1)
        else:
            pieces = self._lookup(recv_lengths, recv_values, source_batch, routes.local)
            send = torch.cat([p.reshape(-1) for per_source in pieces for p in per_source])
        t2 = time.perf_counter()
        recv = differentiable_all_to_all(
            send,
            [b_local * sum(u.width for u in units) for units in routes.units_on],
            send_splits,
            self.group,
            grad_scale=1.0 / self.world_size,
        )
        t3 = time.perf_counter()
        self.stats.output_bytes = send.numel() * send.element_size()
        self.stats.lookup_ms = (t2 - t1) * 1e3
        self.stats.output_ms = (t3 - t2) * 1e3
        return self._assemble(recv, b_local, batch, routes.units)

    def _assemble(self, recv: torch.Tensor, b_local: int, batch: Batch, units: list[LookupUnit]) -> torch.Tensor:
        """Place received blocks of ``units`` (and local replicas) into [B_local, F, D]; a
        feature with neither gets zeros."""
        blocks: dict[int, list[tuple[LookupUnit | None, torch.Tensor]]] = defaultdict(list)
        received = recv.split([b_local * u.width for u in units])
        for u, block in zip(units, received):
            blocks[u.feature].append((u, block.view(b_local, u.width)))
        lengths = self._bag_lengths(batch)
        for p, i in zip(self.replicas, self.replicated):
            vals = batch.feature_values(i)
            offsets = torch.cumsum(lengths[i], 0) - lengths[i]
            if is_half(p):  # float32 sums and gradients
                bounds = torch.cat([offsets, lengths[i].sum().view(1)])
                blocks[i].append((None, pool_sum(p, bags_of_rows(vals, bounds))))
            else:
                blocks[i].append((None, F.embedding_bag(vals, p, offsets, mode="sum", sparse=True)))
        features = []
        zeros = recv.new_zeros(b_local, self.dim) if len(blocks) < len(self.tables) else None
        for f in range(len(self.tables)):
            parts = blocks[f]
            if not parts:
                features.append(zeros)
            elif parts[0][0] is not None and parts[0][0].row_wise:
                features.append(torch.stack([t for _, t in parts]).sum(0))
            elif len(parts) == 1:
                features.append(parts[0][1])
            else:
                features.append(torch.cat([t for _, t in sorted(parts, key=lambda x: x[0].col_start)], dim=1))
        return torch.stack(features, dim=1)

    # --- backward helpers --------------------------------------------------------------
    def sync_replica_grads(self) -> None:
        """Average the sparse gradients of data-parallel tables over the module's ranks (call
        before stepping; a collective, see ``average_sparse_grads``)."""
        average_sparse_grads(list(self.replicas), self.group)
