"""Sptt: DMT's topology-aware exchange, with or without DMT's tower modules."""

from __future__ import annotations

from typing import Any

from distrec.config import RunConfig
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.parallel.mode import Axis, GradientSync, ModelLayout, RunContext
from distrec.parallel.sharded import Sharded
from distrec.parallel.spec import ParallelSpec
from distrec.parallel.sptt_embedding import run_topology, sptt_embeddings, sptt_tower_embeddings
from distrec.tables import TableConfig
from distrec.tower_partition import resolve_towers
from distrec.units import parse_bytes


class Sptt(Sharded):
    """Tower t's tables on host t (table-, column- or row-wise over its ranks, ``parallel.tower_sharding``),
    exchanged by SPTT (DMT, Luo et al., MLSys 2024), which equals the flat all-to-all.

    With DMT's tower modules (``spec.tower_modules``), host h runs tower h's module on its
    tables' pooled embeddings before they cross hosts (step (e)); the module's gradients are
    summed inside the host. Equals the one-process DMT model (DMT-DLRM or DMT-DCN). Without
    them, a table larger than ``parallel.memory_per_rank`` is split by rows over its tower's
    ranks (the others placed by ``tower_sharding``).

    The topology is ``parallel.hosts`` x ``parallel.ranks_per_host`` (default: torchrun's),
    seen as towers of ``parallel.hosts_per_tower`` hosts (``Topology.tower_topology``), so
    ``self.topology``'s hosts are the towers; the towers come from ``parallel.towers``, else
    strided over them. Under 2D sparse parallelism (``distrec.parallel.two_d``), SPTT runs
    inside each replica group: the topology is one group's hosts, with one tower per host of
    the group.
    """

    name = "sptt"

    def __init__(self, ctx: RunContext, spec: ParallelSpec, axes: list[Axis] | None = None) -> None:
        super().__init__(ctx, spec, axes)
        p = ctx.cfg.parallel
        self.topology = run_topology(ctx.world_size, p.hosts, p.ranks_per_host, spec.replica_groups, p.hosts_per_tower)
        self._towers = resolve_towers([t.name for t in ctx.tables], p.towers, self.topology.hosts)

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        p = cfg.parallel
        if cfg.model.tower_module is not None and p.memory_per_rank is not None:
            raise DistrecError("--memory-per-rank with --lookup sptt cannot be combined with --tower-module; drop it, or use --tower-sharding row_wise")
        if p.hosts is not None:  # else the hosts come from torchrun's environment
            topology = run_topology(world_size, p.hosts, p.ranks_per_host, p.replica_groups, p.hosts_per_tower)
            resolve_towers([t.name for t in tables], p.towers, topology.hosts)
        elif p.towers is not None:
            resolve_towers([t.name for t in tables], p.towers, None)

    def model_layout(self) -> ModelLayout:
        return ModelLayout(super().model_layout().tables, self._towers)

    def tower_meta(self) -> dict[str, Any] | None:
        meta = super().tower_meta()
        if meta is not None:  # tower t's module is saved by the first rank of host t (of replica group 0)
            meta["rank"] = [self.topology.rank(t, 0) for t in range(self.topology.hosts)]
        return meta

    def shard_embeddings(self, model: RecommendationModel) -> None:
        tables, p, groups = self.ctx.tables, self.ctx.cfg.parallel, self.spec.replica_groups
        if self.spec.tower_modules:
            model.embeddings = sptt_tower_embeddings(model.embeddings, tables, self.topology, self.ctx.device, p.tower_sharding, groups)
            self.plan = model.embeddings.bags.plan
            return
        fill = model.embeddings.initializer.for_tables(tables).fill
        memory = parse_bytes(p.memory_per_rank, "parallel.memory_per_rank") if p.memory_per_rank else None
        dtype = model.embeddings.weight.dtype
        model.embeddings = sptt_embeddings(tables, fill, self.topology, self._towers, self.ctx.device, p.tower_sharding, groups, memory, dtype)
        self.plan = model.embeddings.plan

    def gradient_sync(self, model: RecommendationModel) -> GradientSync | None:
        if self.spec.tower_modules:
            return GradientSync(model.embeddings.sync_tower_grads)
        return super().gradient_sync(model)
