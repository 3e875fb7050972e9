"""Sharded: tables split over the ranks by a plan, lookups by all-to-all, dense layers in DDP."""

from __future__ import annotations

from collections.abc import Callable

from distrec.components.exchange import ExchangeStats
from distrec.config import RunConfig
from distrec.models.base import RecommendationModel
from distrec.parallel.block_mode import BlockMode
from distrec.parallel.parallelize import resolve_plan
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection
from distrec.tables import TableConfig, stand_in_tables


class Sharded(BlockMode):
    """Hybrid parallelism (the DLRM paper's): every table placed by a ShardingPlan
    (table-, column-, row-wise or replicated), the flat all-to-all, DDP for the rest.

    The plan is ``parallel.plan``, else one ``parallel.sharding`` type for every table, else
    the greedy table-wise plan under ``parallel.memory_per_rank``. Each rank makes only its
    shards, from the seed of the model's stand-in tables, so a sharded run starts exactly
    where a one-process run does.
    """

    name = "sharded"
    embeddings = "sharded"

    @classmethod
    def accepts(cls, cfg: RunConfig, world_size: int) -> bool:
        return world_size > 1 and cfg.parallel.embeddings == "sharded"

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        resolve_plan(tables, cfg.parallel, world_size)

    def model_tables(self) -> list[TableConfig]:
        return stand_in_tables(self.ctx.tables)

    def shard_embeddings(self, model: RecommendationModel) -> None:
        tables = self.ctx.tables
        self.plan = resolve_plan(tables, self.ctx.cfg.parallel, self.ctx.world_size)
        initializer = model.embeddings.initializer.for_tables(tables)
        model.embeddings = ShardedEmbeddingBagCollection.from_initializer(tables, self.plan, initializer, None, self.ctx.device)

    def gradient_sync(self, model: RecommendationModel) -> Callable[[], None] | None:
        """All-reduce the gradients of data-parallel (replicated) tables, when the plan has any."""
        return model.embeddings.sync_replica_grads if model.embeddings.replicas else None

    def exchange_stats(self) -> ExchangeStats | None:
        return self.model.embeddings.stats
