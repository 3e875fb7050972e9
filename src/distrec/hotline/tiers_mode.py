"""HotlineTiers: one process, hot rows in a fast tier and the rest in a slow one (Hotline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from distrec.components.optimization import Optimization
from distrec.errors import DistrecError
from distrec.hotline.training import HotlineTraining, load_into_model
from distrec.models.base import RecommendationModel
from distrec.parallel.mode import CheckpointFormat, ModelLayout, ParallelMode, Telemetry, TrainingStep
from distrec.tables import TableConfig, stand_in_tables


class HotlineTiers(ParallelMode):
    """Hotline in one process (Adnan et al., ISCA 2024): the tables live in two tiers (RAM and
    a memory-mapped file, or device and host memory), the popular micro-batch runs from the
    fast tier while the other's cold rows are gathered; gradients equal ordinary training's.

    The tiers, their row optimizer and the micro-batch pipeline are made together with the
    step (``HotlineTraining``). Checkpoints (``TiersFormat``) hold the small state in the
    rank file and the rows (maybe larger than RAM) as files beside it.
    """

    name = "hotline"
    embeddings = "single"

    training: HotlineTraining

    def model_layout(self) -> ModelLayout:
        return ModelLayout(stand_in_tables(self.ctx.tables))  # the tiers make the real rows, maybe larger than RAM

    def shard_embeddings(self, model: RecommendationModel) -> None:
        """Nothing yet: the tiers replace the stand-in tables when the step is made."""

    def make_step(self, model: RecommendationModel, module: nn.Module, optimization: Optimization) -> TrainingStep:
        c = self.ctx
        self.training = HotlineTraining(model, c.cfg, c.total_steps, c.run_dir, c.tables, c.show_progress, c.timer, optimization)
        return self.training

    def telemetry(self) -> list[Telemetry]:
        h, pipeline = self.ctx.cfg.hotline, self.training.pipeline  # its stats are read when asked: a resume replaces them

        def summary() -> dict[str, Any]:
            pipeline.stats.warn_if_never_hot(h.relearn_every, h.sample_rate)
            return {"hotline": self.training.stats()}

        return [Telemetry(training=lambda: pipeline.stats.fractions(), summary=summary)]

    def checkpoint_format(self) -> CheckpointFormat:
        return TiersFormat(self.training)

    def close(self) -> None:
        if hasattr(self, "training"):
            self.training.close()


class TiersFormat(CheckpointFormat):
    """Hotline's one-process checkpoint: ``hotline`` (dense model, optimizers, schedules,
    pipeline counters) in the rank file, the tiers' rows as files (``HotlineTraining.save``)."""

    tag = "hotline-tiers"

    def __init__(self, training: HotlineTraining) -> None:
        self.training = training

    def state_dict(self) -> dict[str, Any]:
        return {"hotline": self.training.state_dict()}

    def load_state_dict(self, own: dict[str, Any], checkpoint: Path, meta: dict[str, Any]) -> None:
        self.training.load_state_dict(own["hotline"])
        self.training.load(checkpoint)

    def meta(self) -> dict[str, Any]:
        return {"embeddings": HotlineTiers.embeddings, "plan": None}

    def write_files(self, directory: Path) -> None:
        self.training.save(directory)

    @classmethod
    def restored_tables(cls, tables: list[TableConfig]) -> list[TableConfig]:
        return stand_in_tables(tables)  # the saved rows are mapped, maybe larger than RAM

    @classmethod
    def restore_model(cls, model: RecommendationModel, checkpoint: Path, own: dict[str, Any], meta: dict[str, Any]) -> None:
        if "hotline" not in own:
            raise DistrecError(f"checkpoint {str(checkpoint)!r} holds no model state; it is damaged, use another run's checkpoint")
        load_into_model(model, checkpoint, own["hotline"], [TableConfig.from_dict(t) for t in meta["tables"]])
