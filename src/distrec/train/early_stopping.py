"""The best validation AUC so far, when to stop training for lack of progress, and when to warn
that a run of fixed length is overfitting."""

from __future__ import annotations

import math
from typing import Any


class BestModel:
    """Tracks the validation evaluations of a run: the best AUC, its step and metrics, and how
    many evaluations have passed without improving it (a checkpoint part).

    Args:
        patience: evaluations without a better AUC after which ``exhausted`` is true.
        min_delta: how much an AUC must exceed the best to count as better.
    """

    def __init__(self, patience: int, min_delta: float = 1e-4) -> None:
        self.patience = patience
        self.min_delta = min_delta
        self.auc = -math.inf
        self.step: int | None = None
        self.metrics: dict[str, float] = {}
        self.since_best = 0

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Record an evaluation at ``step``; whether it is the new best."""
        auc = metrics.get("auc", math.nan)
        if math.isfinite(auc) and auc > self.auc + self.min_delta:
            self.auc, self.step, self.metrics, self.since_best = auc, step, dict(metrics), 0
            return True
        self.since_best += 1
        return False

    @property
    def exhausted(self) -> bool:
        """Whether ``patience`` evaluations in a row brought no better AUC."""
        return self.step is not None and self.since_best >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"auc": self.auc, "step": self.step, "metrics": dict(self.metrics), "since_best": self.since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.auc, self.step, self.metrics, self.since_best = float(state["auc"]), state["step"], dict(state["metrics"]), int(state["since_best"])


class OverfitWatch:
    """Warns, once per run, when validation says the model got worse than it was: its loss rose
    for ``rises`` evaluations in a row, or its normalized entropy exceeds 1 (worse than always
    predicting the click rate) after at least ``min_steps`` steps (an epoch: earlier, a model
    may not have learned the rate yet)."""

    def __init__(self, min_steps: int, rises: int = 3) -> None:
        self.min_steps, self.rises = min_steps, rises
        self.losses: list[float] = []
        self.warned = False

    def check(self, metrics: dict[str, float], step: int) -> str | None:
        """The warning for this evaluation at ``step``, if one is due (then never again)."""
        self.losses.append(metrics.get("logloss", math.nan))
        recent = self.losses[-self.rises - 1 :]
        rising = len(recent) == self.rises + 1 and all(b > a for a, b in zip(recent, recent[1:]))
        ne = metrics.get("ne", math.nan)
        if self.warned or not (rising or (step >= self.min_steps and ne > 1)):
            return None
        self.warned = True
        what = (
            f"the validation loss rose for {self.rises} evaluations in a row"
            if rising
            else f"the validation NE is {ne:.3f} (above 1: worse than predicting the click rate)"
        )
        return (
            f"{what} at step {step}: the model is overfitting or the learning rate is too high; train until the validation AUC stops "
            "improving (no --epochs or --max-steps), which keeps the best model, or lower --lr"
        )
