"""The best validation AUC so far, and when to stop training for lack of progress."""

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
