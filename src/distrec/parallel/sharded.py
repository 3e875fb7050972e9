"""Sharded: tables split over the ranks by a plan, lookups by all-to-all, dense layers in DDP."""

from __future__ import annotations

from distrec.config import RunConfig
from distrec.models.base import RecommendationModel
from distrec.parallel.block_mode import BlockMode
from distrec.parallel.mode import GradientSync, ModelLayout, Telemetry
from distrec.parallel.parallelize import resolve_plan
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection
from distrec.parallel.spec import ParallelSpec
from distrec.tables import TableConfig, stand_in_tables


class Sharded(BlockMode):
    """Hybrid parallelism (the DLRM paper's): every table placed by a ShardingPlan
    (table-, column-, row-wise or replicated), the flat all-to-all, DDP for the rest.

    The plan is ``parallel.plan``, else one ``parallel.sharding`` type for every table, else
    the greedy table-wise plan under ``parallel.memory_per_rank``, for the ranks of
    ``self.env`` (all of them, or one replica group's). Each rank makes only its shards, from
    the seed of the model's stand-in tables, so a sharded run starts exactly where a
    one-process run does.
    """

    name = "sharded"
    embeddings = "sharded"

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        resolve_plan(tables, cfg.parallel, ParallelSpec.of(cfg, world_size).group_size)

    def model_layout(self) -> ModelLayout:
        return ModelLayout(stand_in_tables(self.ctx.tables))

    def shard_embeddings(self, model: RecommendationModel) -> None:
        tables = self.ctx.tables
        self.plan = resolve_plan(tables, self.ctx.cfg.parallel, self.env.size)
        initializer = model.embeddings.initializer.for_tables(tables)
        dtype = model.embeddings.weight.dtype  # the model's table dtype (``model.table_dtype``)
        model.embeddings = ShardedEmbeddingBagCollection.from_initializer(tables, self.plan, initializer, self.env.group, self.ctx.device, dtype)

    def gradient_sync(self, model: RecommendationModel) -> GradientSync | None:
        """All-reduce the gradients of data-parallel (replicated) tables, when the plan has any."""
        return GradientSync(model.embeddings.sync_replica_grads) if model.embeddings.replicas else None

    def telemetry(self) -> list[Telemetry]:
        return [Telemetry(exchange=lambda: self.model.embeddings.stats), *super().telemetry()]
