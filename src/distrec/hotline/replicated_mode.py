"""ReplicatedHotline: Hotline on many processes, hot rows replicated on every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn
from torch.optim import Optimizer

from distrec.config import RunConfig
from distrec.hotline.distributed import DistributedHotlineTraining, replicated_hot_embeddings
from distrec.models.base import RecommendationModel
from distrec.parallel.mode import RunContext, TrainingStep
from distrec.parallel.parallelize import resolve_plan
from distrec.parallel.reshard import export_blocks
from distrec.parallel.sharded import Sharded


class ReplicatedHotline(Sharded):
    """The hot rows replicated on every rank (popular micro-batches need no all-to-all), the
    rest sharded by the plan as ``Sharded`` shards them; the hot rows' and the dense gradients are
    all-reduced together (no DDP). Trains exactly what the sharded trainer trains.

    Checkpoints are ordinary sharded ones (hot rows written back into their shards) plus the
    hot set, so they reshard like any other.
    """

    name = "hotline-replicated"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.training: DistributedHotlineTraining | None = None

    @classmethod
    def accepts(cls, cfg: RunConfig, world_size: int) -> bool:
        return cfg.hotline.enabled and world_size > 1

    def shard_embeddings(self, model: RecommendationModel) -> None:
        self.plan = resolve_plan(self.ctx.tables, self.ctx.cfg.parallel, self.ctx.world_size)
        model.embeddings = replicated_hot_embeddings(model, self.ctx.tables, self.plan, self.ctx.device)

    def wrap_dense(self, model: RecommendationModel) -> nn.Module:
        return model  # dense gradients are all-reduced with the hot rows' (ReplicatedHotEmbedding.sync_gradients)

    def make_step(self, model: RecommendationModel, module: nn.Module) -> TrainingStep:
        self.training = DistributedHotlineTraining(model, self.ctx.cfg, self.ctx.total_steps, self.ctx.timer)
        return self.training

    def training_extra(self) -> dict[str, float]:
        return self.training.counters.fractions()

    def summary_extra(self) -> dict[str, Any]:
        self.training.counters.warn_if_never_hot(self.ctx.cfg.hotline.relearn_every, self.ctx.cfg.hotline.sample_rate)
        return {"hotline": self.training.stats()}

    def block_module(self) -> nn.Module:
        return self.model.embeddings.cold

    def export_table_blocks(self, sparse: Optimizer | None) -> list[dict[str, Any]]:
        with self.training.rows_in_shards():  # copied: the hot rows leave the shards again
            return export_blocks(self.block_module(), sparse, include_replicas=self.ctx.rank == 0, copy=True)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "hotline": self.training.state_dict()}

    def load_state_dict(self, own: dict[str, Any], checkpoint: Path, meta: dict[str, Any]) -> None:
        super().load_state_dict(own, checkpoint, meta)
        self.training.load_state_dict(own["hotline"])

    @classmethod
    def wrote(cls, own: dict[str, Any], meta: dict[str, Any]) -> bool:
        return "dense" in own and "hotline" in own

    def close(self) -> None:
        if self.training is not None:
            self.training.close()
