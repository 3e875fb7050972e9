"""The best validation loss so far, when to stop training for lack of progress, when a validation
split is too small to choose a model on, and when to warn that a run of fixed length is overfitting.

The best model is the one of the lowest validation logloss, a proper score: it rewards
calibrated click probabilities, and a model that is confidently wrong scores badly. AUC only
ranks: on a small split it jumps with a handful of rows, and a model of wild probabilities
can hold the best AUC while being worse than predicting the click rate (NE above 1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MIN_VALIDATION_CLASS_ROWS = 100
"""Clicks and non-clicks a validation split needs, each, for its loss to choose a model: with
fewer, the loss of two evaluations differs by noise (and AUC is undefined without both)."""


def small_validation_warning(labels: np.ndarray) -> str | None:
    """The warning for a validation split with labels ``labels`` (0/1 [rows]) too small to choose
    ``best/`` and stop on, or None when it has ``MIN_VALIDATION_CLASS_ROWS`` of each class."""
    clicks = int(np.count_nonzero(labels))
    others = int(labels.shape[0]) - clicks
    if min(clicks, others) >= MIN_VALIDATION_CLASS_ROWS:
        return None
    return (
        f"the validation split holds {labels.shape[0]:,} rows ({clicks:,} clicks, {others:,} non-clicks): too few to choose the best "
        f"model and stop on (each needs {MIN_VALIDATION_CLASS_ROWS}+); hold out more rows (--split random:0.2) or use more data, "
        "or give --epochs or --max-steps"
    )


class BestModel:
    """Tracks the validation evaluations of a run: the lowest logloss, its step and metrics, and
    how many evaluations have passed without improving it (a checkpoint part).

    Args:
        patience: evaluations without a lower loss after which ``exhausted`` is true.
        min_delta: how much a loss must fall below the best to count as better.
    """

    def __init__(self, patience: int, min_delta: float = 1e-4) -> None:
        self.patience = patience
        self.min_delta = min_delta
        self.logloss = math.inf
        self.step: int | None = None
        self.metrics: dict[str, float] = {}
        self.since_best = 0

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Record an evaluation at ``step``; whether it is the new best."""
        loss = metrics.get("logloss", math.nan)
        if math.isfinite(loss) and loss < self.logloss - self.min_delta:
            self.logloss, self.step, self.metrics, self.since_best = loss, step, dict(metrics), 0
            return True
        self.since_best += 1
        return False

    @property
    def exhausted(self) -> bool:
        """Whether ``patience`` evaluations in a row brought no lower loss."""
        return self.step is not None and self.since_best >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"logloss": self.logloss, "step": self.step, "metrics": dict(self.metrics), "since_best": self.since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state; one saved when the best was chosen by AUC (no ``logloss``) continues
        from its best model's loss."""
        self.step, self.metrics, self.since_best = state["step"], dict(state["metrics"]), int(state["since_best"])
        self.logloss = float(state["logloss"] if "logloss" in state else self.metrics.get("logloss", math.inf))


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
            f"{what} at step {step}: the model is overfitting or the learning rate is too high; train until the validation loss stops "
            "improving (no --epochs or --max-steps), which keeps the best model, or lower --lr"
        )
