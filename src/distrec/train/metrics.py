"""Binary click-prediction metrics: AUC, log loss, accuracy, normalized entropy."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import log_loss, roc_auc_score

EPS = 1e-7


def click_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Metrics of predicted click probabilities against 0/1 labels.

    Returns ``auc`` (NaN when only one class is present), ``logloss`` (nats per sample),
    ``accuracy`` (threshold 0.5), ``ne`` (normalized entropy: log loss divided by the
    entropy of the base click rate, He et al. 2014; < 1 beats always predicting the rate)
    and ``rows``.
    """
    labels = np.asarray(labels, dtype=np.float64)
    probs = np.clip(np.asarray(probs, dtype=np.float64), EPS, 1 - EPS)
    rows = labels.shape[0]
    if rows == 0:
        return {"auc": math.nan, "logloss": math.nan, "accuracy": math.nan, "ne": math.nan, "rows": 0}
    has_both = 0 < labels.sum() < rows
    auc = float(roc_auc_score(labels, probs)) if has_both else math.nan
    loss = float(log_loss(labels, probs, labels=[0, 1]))
    rate = float(np.clip(labels.mean(), EPS, 1 - EPS))
    base_entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return {
        "auc": auc,
        "logloss": loss,
        "accuracy": float(((probs >= 0.5) == (labels >= 0.5)).mean()),
        "ne": loss / base_entropy,
        "rows": int(rows),
    }
