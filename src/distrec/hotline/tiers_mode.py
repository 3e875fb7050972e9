"""HotlineTiers: one process, hot rows in a fast tier and the rest in a slow one (Hotline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from distrec.config import RunConfig
from distrec.errors import DistrecError
from distrec.hotline.training import HotlineTraining, load_into_model
from distrec.models.base import RecommendationModel
from distrec.parallel.mode import ParallelMode, RunContext, TrainingStep
from distrec.tables import TableConfig, stand_in_tables


class HotlineTiers(ParallelMode):
    """Hotline in one process (Adnan et al., ISCA 2024): the tables live in two tiers (RAM and
    a memory-mapped file, or device and host memory), the popular micro-batch runs from the
    fast tier while the other's cold rows are gathered; gradients equal ordinary training's.

    Checkpoints hold the small state in the rank file and the rows (maybe larger than RAM)
    as files beside it (``HotlineTraining.save``).
    """

    name = "hotline"
    embeddings = "single"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.training: HotlineTraining | None = None

    @classmethod
    def accepts(cls, cfg: RunConfig, world_size: int) -> bool:
        return cfg.hotline.enabled and world_size == 1

    def model_tables(self) -> list[TableConfig]:
        return stand_in_tables(self.ctx.tables)  # the tiers make the real rows, maybe larger than RAM

    def make_step(self, model: RecommendationModel, module: nn.Module) -> TrainingStep:
        c = self.ctx
        self.training = HotlineTraining(model, c.cfg, c.total_steps, c.run_dir, c.tables, c.progress, c.timer)
        return self.training

    def training_extra(self) -> dict[str, float]:
        return self.training.pipeline.stats.fractions()

    def summary_extra(self) -> dict[str, Any]:
        self.training.pipeline.stats.warn_if_never_hot(self.ctx.cfg.hotline.relearn_every, self.ctx.cfg.hotline.sample_rate)
        return {"hotline": self.training.stats()}

    def state_dict(self) -> dict[str, Any]:
        return {"hotline": self.training.state_dict(), "blocks": []}

    def load_state_dict(self, own: dict[str, Any], checkpoint: Path, meta: dict[str, Any]) -> None:
        self.training.load_state_dict(own["hotline"])
        self.training.load(checkpoint)

    def write_files(self, directory: Path) -> None:
        self.training.save(directory)

    @classmethod
    def wrote(cls, own: dict[str, Any], meta: dict[str, Any]) -> bool:
        return "dense" not in own

    @classmethod
    def restored_tables(cls, tables: list[TableConfig]) -> list[TableConfig]:
        return stand_in_tables(tables)  # the saved rows are mapped, maybe larger than RAM

    @classmethod
    def restore_model(cls, model: RecommendationModel, checkpoint: Path, own: dict[str, Any], meta: dict[str, Any]) -> None:
        if "hotline" not in own:
            raise DistrecError(f"checkpoint {str(checkpoint)!r} holds no model state; it is damaged, use another run's checkpoint")
        load_into_model(model, checkpoint, own["hotline"], [TableConfig.from_dict(t) for t in meta["tables"]])

    def close(self) -> None:
        if self.training is not None:
            self.training.close()
