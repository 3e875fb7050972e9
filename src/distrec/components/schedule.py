"""Learning-rate schedule: linear warm-up, then an optional decay (as in the DLRM reference code)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from distrec.errors import DistrecError

DECAYS = ("none", "linear", "cosine", "poly")


@dataclass
class LRSchedule:
    """The factor that multiplies the base learning rate at optimizer step ``step`` (0-based).

    - warm-up, ``step < warmup_steps``: ``(step + 1) / warmup_steps``;
    - decay, from ``decay_start_step`` over ``decay_steps`` steps, with progress
      p = (step - decay_start_step) / decay_steps clipped to [0, 1]: ``linear`` 1 - p,
      ``cosine`` (1 + cos(pi p)) / 2, ``poly`` (1 - p)^2 (the DLRM reference's decay);
      after the decay the factor stays at its final value, 0;
    - otherwise 1.

    Example:
        >>> s = LRSchedule(warmup_steps=10, decay="poly", decay_start_step=100, decay_steps=50)
        >>> s(0), s(9), s(50), s(125), s(200)
        (0.1, 1.0, 1.0, 0.25, 0.0)
    """

    warmup_steps: int = 0
    decay: str = "none"
    decay_start_step: int = 0
    decay_steps: int = 0

    def __post_init__(self) -> None:
        if self.decay not in DECAYS:
            raise DistrecError(f"train.decay is {self.decay!r}; choose one of: {', '.join(DECAYS)}")
        if self.decay != "none" and self.decay_steps < 1:
            raise DistrecError(f"train.decay is {self.decay!r} but train.decay_steps is {self.decay_steps}; set train.decay_steps to at least 1")
        if min(self.warmup_steps, self.decay_start_step, self.decay_steps) < 0:
            raise DistrecError("train.warmup_steps, train.decay_start_step and train.decay_steps must be 0 or more")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay == "none" or step < self.decay_start_step:
            return 1.0
        p = min((step - self.decay_start_step) / self.decay_steps, 1.0)
        if self.decay == "linear":
            return 1.0 - p
        if self.decay == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * p))
        return (1.0 - p) ** 2


def make_schedulers(optimizers: list[Optimizer], warmup_steps: int = 0, decay: str = "none", decay_start_step: int = 0, decay_steps: int = 0) -> list[LambdaLR]:
    """One ``LambdaLR`` per optimizer following ``LRSchedule(...)``; step them once per optimizer step.

    Their ``state_dict`` holds the step count (and the schedule's fields), so a resumed run
    continues the schedule where it stopped.

    Example:
        >>> schedulers = make_schedulers(optimizers, warmup_steps=100, decay="cosine", decay_steps=10_000)
    """
    schedule = LRSchedule(warmup_steps, decay, decay_start_step, decay_steps)
    return [LambdaLR(opt, schedule) for opt in optimizers]
