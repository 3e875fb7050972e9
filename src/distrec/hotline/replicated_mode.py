"""ReplicatedHotline: Hotline on many processes, hot rows replicated on every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn
from torch.optim import Optimizer

from distrec.components.optimization import Optimization
from distrec.hotline.distributed import DistributedHotlineTraining, replicated_hot_embeddings
from distrec.models.base import RecommendationModel
from distrec.parallel.block_mode import BlockFormat
from distrec.parallel.mode import CheckpointFormat, Telemetry, TrainingStep
from distrec.parallel.parallelize import resolve_plan
from distrec.parallel.reshard import export_blocks
from distrec.parallel.sharded import Sharded


class ReplicatedHotline(Sharded):
    """The hot rows replicated on every rank (popular micro-batches need no all-to-all), the
    rest sharded by the plan as ``Sharded`` shards them; the hot rows' and the dense gradients are
    all-reduced together (no DDP). Trains exactly what the sharded trainer trains.

    Checkpoints are ordinary sharded ones (hot rows written back into their shards) plus the
    hot set (``HotBlockFormat``), so they reshard like any other.
    """

    name = "hotline-replicated"

    training: DistributedHotlineTraining

    def shard_embeddings(self, model: RecommendationModel) -> None:
        self.plan = resolve_plan(self.ctx.tables, self.ctx.cfg.parallel, self.ctx.world_size)
        model.embeddings = replicated_hot_embeddings(model, self.ctx.tables, self.plan, self.ctx.device)

    def wrap_dense(self, model: RecommendationModel) -> nn.Module:
        return model  # dense gradients are all-reduced with the hot rows' (ReplicatedHotEmbedding.sync_gradients)

    def make_step(self, model: RecommendationModel, module: nn.Module, optimization: Optimization) -> TrainingStep:
        self.training = DistributedHotlineTraining(model, self.ctx.cfg, self.ctx.total_steps, self.ctx.timer, optimization)
        return self.training

    def telemetry(self) -> list[Telemetry]:
        h, training = self.ctx.cfg.hotline, self.training  # its counters are read when asked: a resume replaces them

        def summary() -> dict[str, Any]:
            training.counters.warn_if_never_hot(h.relearn_every, h.sample_rate)
            return {"hotline": training.stats()}

        return [Telemetry(exchange=lambda: self.model.embeddings.stats, training=lambda: training.counters.fractions(), summary=summary)]

    def block_module(self) -> nn.Module:
        return self.model.embeddings.cold

    def export_table_blocks(self, sparse: Optimizer | None) -> list[dict[str, Any]]:
        with self.training.rows_in_shards():  # copied: the hot rows leave the shards again
            return export_blocks(self.block_module(), sparse, include_replicas=self.ctx.rank == 0, copy=True)

    def checkpoint_format(self) -> CheckpointFormat:
        return HotBlockFormat(self)

    def close(self) -> None:
        if hasattr(self, "training"):
            self.training.close()


class HotBlockFormat(BlockFormat):
    """The block layout (restored as any block checkpoint is) plus ``hotline``: the hot set and
    the pipeline's counters."""

    tag = "hotline-replicated"
    mode: ReplicatedHotline

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "hotline": self.mode.training.state_dict()}

    def load_state_dict(self, own: dict[str, Any], checkpoint: Path, meta: dict[str, Any]) -> None:
        super().load_state_dict(own, checkpoint, meta)
        self.mode.training.load_state_dict(own["hotline"])
