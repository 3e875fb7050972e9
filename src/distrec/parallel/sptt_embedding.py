"""The sharded embedding collection with SPTT instead of the flat output all-to-all.

Tower t's tables live on host t (or on tower t's K hosts, ``Topology.tower_topology``),
table-, column- or row-wise over its ranks (``FeatureLayout.from_towers``).
Forward on every rank (DMT, Luo et al., MLSys 2024, Fig. 7):

(a) input all-to-all: the bags of every feature go to the rank holding its table (the
    same exchange as ``ShardedEmbeddingBagCollection``);
(b) lookup: the owner pools its tables for all ``B = world_size x b`` global samples;
(c) is done while pooling (the rows come out in peer order);
(d)-(f) ``distrec.parallel.sptt.sptt_exchange``: inside the host (a reduce-scatter when
    row-wise), then among peers.

Without a tower module the result is ``[b, F, D]`` equal to the flat module's (values and
gradients); with one, ``[b, sum of tower outputs]``, and the tower module's parameter
gradients must be synchronised inside the host with :func:`sync_tower_grads`.

Gradient scale: as in the flat module, every rank's loss is its local mean, so the gradients
reaching the tables are divided by world_size on their way back (step (d)'s backward).

Example:
    >>> layout = FeatureLayout.from_towers(topology, partition.feature_indices(names))  # doctest: +SKIP
    >>> ebc = SpttEmbeddingBagCollection.from_fill(tables, layout, groups, full_weights_fill(tables, full))  # doctest: +SKIP
    >>> ebc(local_batch).shape                                                           # doctest: +SKIP
    torch.Size([b, F, D])
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.parallel.plan import Shard, ShardingPlan, TablePlacement
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection, TableFill
from distrec.parallel.sptt import FeatureLayout, sptt_exchange
from distrec.parallel.topology import Topology, TopologyGroups
from distrec.tables import TableConfig


def tower_plan(tables: Sequence[TableConfig], layout: FeatureLayout) -> ShardingPlan:
    """The plan that puts table f on the rank(s) of ``layout`` that pool feature f: table-wise,
    column-wise over its host's ranks when the layout splits columns, or row-wise over them in
    contiguous, balanced row ranges when it splits rows (a table with fewer rows than the host
    has ranks leaves some of them without a shard of it)."""
    shards: dict[int, list[Shard]] = {f: [] for f in range(len(tables))}
    holders: dict[int, list[int]] = {f: [] for f in range(len(tables))}
    for rank, features in enumerate(layout.features_of_rank):
        for f in features:
            holders[f].append(rank)
    for f, ranks in holders.items():
        rows, dim = tables[f].num_rows, tables[f].dim
        for l, rank in enumerate(ranks):
            if f in layout.row_wise_features:
                start, end = round(rows * l / len(ranks)), round(rows * (l + 1) / len(ranks))
                shards[f] += [Shard(rank, start, end, 0, dim)] if end > start else []
            else:
                start, end = layout.columns_of_rank[rank] if layout.columns_of_rank is not None else (0, dim)
                shards[f].append(Shard(rank, 0, rows, start, end))

    def kind(f: int) -> str:
        return "row_wise" if f in layout.row_wise_features else "column_wise" if len(shards[f]) > 1 else "table_wise"

    return ShardingPlan(layout.topology.world_size, [TablePlacement(t.name, kind(f), shards[f]) for f, t in enumerate(tables)])


class SpttEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """Embedding bags sharded by tower, exchanged with SPTT (optionally through a tower module).

    Args:
        tables: one table per feature, in the global feature order.
        layout: the features each rank pools (towers on hosts).
        groups: this rank's groups (``Topology.build_groups``); the tables are sharded over
            ``groups.everyone`` (one replica group's ranks under 2D sparse parallelism).
        tower_module: optional module ``[H*b, F_host, D] -> [H*b, out]`` for this host's tower.
        tower_dims: ``out`` of every host's tower module (required with ``tower_module``).
        device: where to allocate the weights.
        dtype: how the rows are stored (``distrec.table_dtype``).
    """

    def __init__(
        self,
        tables: list[TableConfig],
        layout: FeatureLayout,
        groups: TopologyGroups,
        tower_module: nn.Module | None = None,
        tower_dims: Sequence[int] | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(tables, tower_plan(tables, layout), groups.everyone, device, dtype)
        self.layout = layout
        self.groups = groups
        self.tower_module = tower_module
        self.tower_dims = None if tower_dims is None else list(tower_dims)
        local_features = [u.feature for u in self.local_units]
        # columns of the pooled tensor: the layout's order of this rank's features; a row-wise
        # feature without rows here pools zeros (column n_local, appended)
        n_local = len(local_features)
        self.column_of_unit = [local_features.index(f) if f in local_features else n_local for f in layout.features_of_rank[self.rank]]

    @classmethod
    def from_fill(cls, tables, layout, groups, fill: TableFill, tower_module=None, tower_dims=None, device=None, dtype=torch.float32):
        """This rank's tables with weights from ``fill`` (``TableInit.fill``, or ``full_weights_fill``)."""
        module = cls(tables, layout, groups, tower_module, tower_dims, device, dtype)
        module.load_weights(fill)
        return module

    def pool_global(self, batch: Batch) -> torch.Tensor:
        """Steps (a) + (b): this rank's tables pooled for every global sample, ``[B, F_rank, D]``,
        the rows in peer order (``distrec.parallel.sptt.to_peer_order``: step (c) done while
        pooling).

        Sets ``stats.input_bytes``, ``input_ms`` and ``lookup_ms``.
        """
        recv_lengths, recv_values, source_batch = self.exchange_inputs(batch)
        t1 = time.perf_counter()
        n_local, rows = len(self.local_units), sum(source_batch)
        if n_local == 0:  # still a graph node, so this rank joins the backward exchanges
            pooled = batch.dense.new_zeros(rows, 0, self.dim).requires_grad_()
        else:
            pieces = self._lookup(recv_lengths, recv_values, source_batch)
            pooled = torch.cat([torch.stack(pieces[source], dim=1) for source in self.layout.topology.peer_order])
        if n_local in self.column_of_unit:
            pooled = torch.cat([pooled, pooled.new_zeros(rows, 1, self.dim)], dim=1)
        pooled = pooled[:, self.column_of_unit]
        self.stats.lookup_ms = (time.perf_counter() - t1) * 1e3
        return pooled

    def _largest_batch(self, batch: Batch) -> int:
        """The most samples any rank of the group holds in this step: from the loader (host
        only), else agreed by an all-reduce (a device sync on a GPU)."""
        if batch.layout is not None and batch.layout.largest_shard is not None:
            return batch.layout.largest_shard
        largest = torch.tensor([batch.batch_size], device=batch.labels.device)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self.group)
        return int(largest)

    def forward(self, batch: Batch) -> torch.Tensor:
        """``[b, F, D]`` in the global feature order, or ``[b, sum(tower_dims)]`` with a tower module.

        SPTT needs the same b on every rank; smaller batches (the end of an epoch or of an
        evaluation) are padded with empty samples whose outputs are dropped.
        """
        pooled = self.pool_global(pad_batch(batch, self._largest_batch(batch), len(self.tables)))
        t0 = time.perf_counter()
        out = sptt_exchange(pooled, self.layout, self.groups, self.tower_module, self.tower_dims, 1.0 / self.world_size, rows_in_peer_order=True)
        # the SPTT exchanges (tower module included); bytes this rank sends in (d) and receives
        # in (f), each unless skipped
        topology = self.layout.topology
        self.stats.output_ms = (time.perf_counter() - t0) * 1e3
        self.stats.output_bytes = (pooled.numel() * (topology.ranks_per_host > 1) + out.numel() * (topology.hosts > 1)) * out.element_size()
        return out[: batch.batch_size]


def pad_batch(batch: Batch, rows: int, num_features: int) -> Batch:
    """``batch`` followed by samples with empty bags, zero dense features and label 0, ``rows`` in all."""
    extra = rows - batch.batch_size
    if extra == 0:
        return batch
    lengths = torch.diff(batch.sparse_offsets).view(num_features, batch.batch_size)
    lengths = torch.nn.functional.pad(lengths, (0, extra))
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    pad_rows = (0, 0, 0, extra)
    # the same indices: each feature's still start where they did, within their tables
    layout = None if batch.layout is None else replace(batch.layout, one_per_bag=False)
    return Batch(torch.nn.functional.pad(batch.dense, pad_rows), batch.sparse_values, offsets, torch.nn.functional.pad(batch.labels, (0, extra)), layout)


def run_topology(world_size: int, hosts: int | None = None, ranks_per_host: int | None = None, replica_groups: int = 1, hosts_per_tower: int = 1) -> Topology:
    """The topology SPTT runs on: the run's ``hosts`` x ``ranks_per_host`` (default: torchrun's
    environment), checked against ``world_size``; with ``replica_groups`` G > 1 (2D sparse
    parallelism), the hosts of one replica group, ``hosts / G`` x ``ranks_per_host``; with
    ``hosts_per_tower`` K > 1, that topology's towers of K hosts (``Topology.tower_topology``)."""
    topology = Topology(hosts, ranks_per_host) if hosts is not None else Topology.from_env()
    topology.check_world_size(world_size)
    if topology.hosts % replica_groups != 0:
        raise DistrecError(
            f"--replica-groups {replica_groups} with --lookup sptt must divide the {topology.hosts} hosts (each group runs SPTT on whole hosts); "
            "change --replica-groups or --hosts"
        )
    return Topology(topology.hosts // replica_groups, topology.ranks_per_host).tower_topology(hosts_per_tower)


def tower_layout(
    tables: list[TableConfig], topology: Topology, towers: Sequence[Sequence[int]], sharding: str, memory_per_rank: int | None = None
) -> FeatureLayout:
    """The layout of ``towers`` on ``topology`` split ``sharding`` over each host's ranks.

    With ``memory_per_rank`` (bytes of weights), while a rank holds more than that, the
    largest of its tables not yet split is split by rows over its host's ranks (the others stay
    table-wise); a DistrecError when no split is left and a rank still holds too much.
    """
    row_wise: set[int] = set()
    while True:
        layout = FeatureLayout.from_towers(topology, towers, sharding, tables[0].dim, row_wise=sorted(row_wise))
        if memory_per_rank is None:
            return layout
        plan = tower_plan(tables, layout)
        held: dict[int, list[tuple[int, int]]] = {r: [] for r in range(topology.world_size)}  # rank -> (bytes, feature)
        for f, placement in enumerate(plan.tables):
            for shard in placement.shards:
                held[shard.rank].append((shard.num_bytes, f))
        fullest = max(held, key=lambda r: sum(n for n, _ in held[r]))
        whole = [(n, f) for n, f in held[fullest] if f not in layout.row_wise_features]
        if sum(n for n, _ in held[fullest]) <= memory_per_rank or not whole:
            plan.validate(tables, memory_per_rank)
            return layout
        row_wise.add(max(whole)[1])


def sptt_embeddings(
    tables: list[TableConfig],
    fill: TableFill,
    topology: Topology,
    towers: Sequence[Sequence[int]],
    device: torch.device | None = None,
    sharding: str = "table_wise",
    copies: int = 1,
    memory_per_rank: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> SpttEmbeddingBagCollection:
    """The SPTT module of a training run (call on every rank, at the same point: it builds the groups).

    Args:
        tables: the model's tables, in feature order.
        fill: the tables' initial weights (``TableInit.fill`` of the model's initializer).
        topology: the run's topology (``run_topology``).
        towers: feature indices of each tower, one tower per host of ``topology``
            (``distrec.towers.partition.resolve_towers``).
        device: where the shards live.
        sharding: ``table_wise``, ``column_wise`` or ``row_wise``, how a tower's tables split over its host's ranks.
        copies: replica groups running ``topology`` each (2D sparse parallelism), this rank's in its own.
        memory_per_rank: bytes of table weights a rank holds at most: a table larger than
            that is split by rows over its host's ranks (``tower_layout``).
        dtype: how the rows are stored (``distrec.table_dtype``).
    """
    layout = tower_layout(tables, topology, towers, sharding, memory_per_rank)
    return SpttEmbeddingBagCollection.from_fill(tables, layout, topology.build_groups(copies=copies), fill, device=device, dtype=dtype)


class SpttTowerEmbeddings(nn.Module):
    """The distributed form of ``distrec.models.dmt.TowerEmbeddings``: ``Batch -> [b, K, D]``.

    Host h holds tower h's tables (over its ranks) and a copy of tower h's module on each of
    its ranks; SPTT applies the module at step (e), so only its outputs cross hosts. The
    result equals ``TowerEmbeddings``' output for this rank's samples.

    Args:
        bags: the SPTT module, built with this host's tower module and every tower's width.
        num_vectors: K, the towers' outputs in vectors of width ``dim``.
        dim: D, the tower modules' width unit.
    """

    def __init__(self, bags: SpttEmbeddingBagCollection, num_vectors: int, dim: int) -> None:
        super().__init__()
        if bags.tower_module is None:
            raise ValueError("SpttTowerEmbeddings needs an SPTT module built with a tower module")
        self.bags = bags
        self.host = bags.layout.topology.host(bags.rank)
        self.num_vectors, self.dim = num_vectors, dim

    @property
    def stats(self):
        """The exchanges' bytes and times of the last forward (``ExchangeStats``)."""
        return self.bags.stats

    def tower_modules(self) -> dict[int, nn.Module]:
        """The tower modules held here, by tower index (this host's)."""
        return {self.host: self.bags.tower_module}

    def sync_tower_grads(self) -> None:
        """Synchronise this host's tower-module gradients inside the host (before the optimizer step)."""
        sync_tower_grads(self.bags.tower_module, self.bags.groups, self.bags.world_size)

    def forward(self, batch: Batch) -> torch.Tensor:
        out = self.bags(batch)
        return out.view(out.shape[0], self.num_vectors, self.dim)


def sptt_tower_embeddings(
    tower_embeddings: nn.Module,
    tables: list[TableConfig],
    topology: Topology,
    device: torch.device | None = None,
    sharding: str = "table_wise",
    copies: int = 1,
) -> SpttTowerEmbeddings:
    """The distributed form of a ``TowerEmbeddings`` built identically on every rank (collective).

    Each rank makes its shards of ``tables`` from the seed (and in the dtype) of ``tower_embeddings``' bags
    (which may be one-row stand-ins, ``distrec.tables.stand_in_tables``) and takes its host's
    tower module (tower h on host h), so a distributed run starts where a single-process one
    does; ``sharding`` and ``copies`` are as in ``sptt_embeddings`` (no row-wise large tables
    among table-wise ones: a tower module takes its features in the tower's order, which
    ``FeatureLayout.host_features`` keeps only for a uniform placement).
    """
    bags = tower_embeddings.bags
    fill = bags.initializer.for_tables(tables).fill
    layout = FeatureLayout.from_towers(topology, tower_embeddings.towers, sharding, bags.dim)
    groups = topology.build_groups(copies=copies)
    module = tower_embeddings.modules_by_tower[topology.host(groups.rank)].to(device)
    sptt = SpttEmbeddingBagCollection.from_fill(tables, layout, groups, fill, module, tower_embeddings.tower_dims, device, bags.weight.dtype)
    return SpttTowerEmbeddings(sptt, tower_embeddings.num_vectors, tower_embeddings.dim)


def sync_tower_grads(module: nn.Module, groups: TopologyGroups, world_size: int) -> None:
    """Sum a tower module's gradients over its host's ranks, divided by ``world_size``.

    Each rank of host h back-propagates the losses of its peers' samples through tower h, and
    every rank's loss is its local mean; the host-wide sum over world_size is then the
    gradient of the global mean loss. Only the intra-host group is used.
    """
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=groups.intra_host)
            p.grad.div_(world_size)
