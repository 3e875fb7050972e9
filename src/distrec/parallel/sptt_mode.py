"""Sptt and SpttTowers: DMT's topology-aware exchange, without and with tower modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distrec.config import RunConfig
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.parallel.mode import RunContext
from distrec.parallel.sharded import Sharded
from distrec.parallel.sptt_embedding import run_topology, sptt_embeddings, sptt_tower_embeddings
from distrec.tables import TableConfig
from distrec.tower_partition import resolve_towers
from distrec.units import parse_bytes


class Sptt(Sharded):
    """Tower t's tables on host t (table-, column- or row-wise over its ranks, ``parallel.tower_sharding``),
    exchanged by SPTT (DMT, Luo et al., MLSys 2024), which equals the flat all-to-all.

    With ``parallel.memory_per_rank``, a table larger than that is split by rows over its
    tower's ranks (the others placed by ``tower_sharding``).

    The topology is ``parallel.hosts`` x ``parallel.ranks_per_host`` (default: torchrun's),
    seen as towers of ``parallel.hosts_per_tower`` hosts (``Topology.tower_topology``), so
    ``self.topology``'s hosts are the towers; the towers come from ``parallel.towers``, else
    strided over them. Under 2D sparse
    parallelism (``distrec.parallel.two_d``), SPTT runs inside each replica group: the
    topology is one group's hosts, with one tower per host of the group.
    """

    name = "sptt"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        p = ctx.cfg.parallel
        self.topology = run_topology(ctx.world_size, p.hosts, p.ranks_per_host, p.replica_groups, p.hosts_per_tower)
        self._towers = resolve_towers([t.name for t in ctx.tables], p.towers, self.topology.hosts)

    @classmethod
    def accepts(cls, cfg: RunConfig, world_size: int) -> bool:
        return world_size > 1 and cfg.parallel.lookup == "sptt" and cfg.model.tower_module is None

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        p = cfg.parallel
        if p.hosts is not None:  # else the hosts come from torchrun's environment
            topology = run_topology(world_size, p.hosts, p.ranks_per_host, p.replica_groups, p.hosts_per_tower)
            resolve_towers([t.name for t in tables], p.towers, topology.hosts)
        elif p.towers is not None:
            resolve_towers([t.name for t in tables], p.towers, None)

    def towers(self) -> list[list[int]] | None:
        return self._towers

    def tower_meta(self) -> dict[str, Any] | None:
        meta = super().tower_meta()
        if meta is not None:  # tower t's module is saved by the first rank of host t (of replica group 0)
            meta["rank"] = [self.topology.rank(t, 0) for t in range(self.topology.hosts)]
        return meta

    def shard_embeddings(self, model: RecommendationModel) -> None:
        tables, p = self.ctx.tables, self.ctx.cfg.parallel
        fill = model.embeddings.initializer.for_tables(tables).fill
        memory = parse_bytes(p.memory_per_rank, "parallel.memory_per_rank") if p.memory_per_rank else None
        model.embeddings = sptt_embeddings(tables, fill, self.topology, self._towers, self.ctx.device, p.tower_sharding, p.replica_groups, memory)
        self.plan = model.embeddings.plan


class SpttTowers(Sptt):
    """SPTT with DMT's tower modules: host h runs tower h's module on its tables' pooled
    embeddings before they cross hosts (step (e)); the module's gradients are summed inside
    the host. Equals the one-process DMT model (DMT-DLRM or DMT-DCN)."""

    name = "sptt-towers"

    @classmethod
    def accepts(cls, cfg: RunConfig, world_size: int) -> bool:
        return world_size > 1 and cfg.parallel.lookup == "sptt" and cfg.model.tower_module is not None

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        if cfg.parallel.memory_per_rank is not None:
            raise DistrecError("--memory-per-rank with --lookup sptt cannot be combined with --tower-module; drop it, or use --tower-sharding row_wise")
        super().check(cfg, world_size, tables)

    def shard_embeddings(self, model: RecommendationModel) -> None:
        p = self.ctx.cfg.parallel
        model.embeddings = sptt_tower_embeddings(model.embeddings, self.ctx.tables, self.topology, self.ctx.device, p.tower_sharding, p.replica_groups)
        self.plan = model.embeddings.bags.plan

    def gradient_sync(self, model: RecommendationModel) -> Callable[[], None] | None:
        return model.embeddings.sync_tower_grads
