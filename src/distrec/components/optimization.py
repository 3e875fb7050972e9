"""Optimization: the optimizers and learning-rate schedules of a run, as one recipe.

The trainer makes it from the ``train`` settings and the run's length; a parallel mode asks
it for the optimizers of the model it built and for their schedules, and reads no training
setting itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from distrec.components.optim import make_optimizers
from distrec.components.schedule import make_schedulers
from distrec.config import TrainConfig, chosen_optimizers
from distrec.models.base import RecommendationModel


@dataclass(frozen=True)
class Optimization:
    """The optimizers and schedules of a run (see ``make_optimizers`` and ``make_schedulers``)."""

    optimizer: str
    """Of the dense layers (and DMT's tower modules): ``sgd``, ``adagrad`` or ``adam``."""
    lr: float
    embedding_optimizer: str
    """Of the embedding rows, in its sparse row-wise form."""
    embedding_lr: float
    weight_decay: float
    embedding_weight_decay: float
    warmup_steps: int
    decay: str
    decay_start_step: int
    decay_steps: int
    """Steps the decay spans (the run's length when the settings leave it 0)."""

    @classmethod
    def of(cls, t: TrainConfig, total_steps: int) -> Optimization:
        """The recipe of ``t`` (unset optimizers take their defaults) for a run of ``total_steps`` optimizer steps."""
        chosen = chosen_optimizers(t)
        return cls(
            chosen.optimizer,
            chosen.lr,
            chosen.embedding_optimizer,
            chosen.embedding_lr,
            t.weight_decay,
            t.embedding_weight_decay,
            t.warmup_steps,
            t.decay,
            t.decay_start_step,
            t.decay_steps or total_steps,
        )

    def optimizers(self, model: RecommendationModel) -> list[Optimizer]:
        """Dense, tower-module and sparse row optimizers of ``model`` (those that have parameters)."""
        return make_optimizers(model, self.optimizer, self.lr, self.embedding_optimizer, self.embedding_lr, self.weight_decay, self.embedding_weight_decay)

    def schedulers(self, optimizers: list[Optimizer]) -> list[LambdaLR]:
        """One schedule per optimizer, stepped once per optimizer step."""
        return make_schedulers(optimizers, self.warmup_steps, self.decay, self.decay_start_step, self.decay_steps)

    def describe(self) -> str:
        """One line naming the optimizers and learning rates (for a run that left them to distrec)."""
        return (
            f"optimizers {self.optimizer} (lr {self.lr:g}) for the dense layers and row-wise {self.embedding_optimizer} "
            f"(lr {self.embedding_lr:g}) for the embedding rows (--optimizer and --lr to choose)"
        )
