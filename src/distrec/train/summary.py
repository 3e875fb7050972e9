"""Summary: what a finished run reports (``summary.json``), and the breakdown's description."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from distrec.components.breakdown import StepTimer
from distrec.parallel.plan import ShardingPlan

METRICS = ("auc", "logloss", "accuracy", "ne")
"""The click metrics every evaluation reports (``distrec.train.metrics``)."""


def _number(value: float | None) -> float | None:
    """A metric as JSON has it: a finite number, else null (no validation rows, or a metric a
    constant prediction leaves undefined); JSON has no NaN."""
    return value if value is not None and math.isfinite(value) else None


@dataclass
class Summary:
    """The run's final model and speed, as ``summary.json`` holds them (``to_dict``)."""

    metrics: dict[str, float]
    """The reported model's validation metrics (``METRICS``, ``rows`` and the mode's extras)."""
    steps: int
    epochs: float
    samples_per_s: float
    train_rows: int
    world_size: int
    embeddings: str
    all_to_all_bytes: int
    """Sent by this rank's embedding exchanges in this invocation's training steps."""
    peak_rss_bytes_per_rank: list[int]
    stopping: dict[str, Any]
    """Why training stopped and, without a fixed length, which step's model is reported."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The parallel mode's entries (``Telemetry.summary``)."""
    test: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        summary = {
            **{k: _number(self.metrics.get(k)) for k in METRICS},
            "steps": self.steps,
            "epochs": self.epochs,
            "samples_per_s": self.samples_per_s,
            "train_rows": self.train_rows,
            "val_rows": int(self.metrics.get("rows", 0)),
            "world_size": self.world_size,
            "embeddings": self.embeddings,
            "all_to_all_bytes": self.all_to_all_bytes,
            "peak_rss_bytes_per_rank": self.peak_rss_bytes_per_rank,
            **{k: v for k, v in self.metrics.items() if k not in (*METRICS, "rows")},  # the mode's evaluation extras
            **self.extra,
            **self.stopping,
        }
        if self.test:
            summary["test"] = self.test
        return summary


def breakdown_description(world_size: int, embeddings: str, plan: ShardingPlan | None, batch_size: int, timer: StepTimer, dense_bytes: int) -> dict[str, Any]:
    """What a run's breakdown describes, and the bytes this rank's collectives sent per step
    (``dense_bytes``: the dense gradients' all-reduce, for a mode that did not charge its own)."""
    label = f"{world_size}p {embeddings}"
    if plan is not None:
        label += " " + "+".join(sorted({p.sharding for p in plan.tables}))
    sent = timer.bytes_per_step()
    if not sent["gradient_all_reduce"]:  # a mode that reduces its own gradients (Hotline) charged its real bytes
        sent["gradient_all_reduce"] = dense_bytes
    return {"label": label, "world_size": world_size, "embeddings": embeddings, "batch_size": batch_size, "bytes_per_step": sent}


def reported_model(step: int, last: dict[str, float], best_step: int | None, best: dict[str, float]) -> dict[str, Any]:
    """Which model a summary's metrics describe, named in it: the best one kept in ``best/``
    (early stopping's, from ``best_step``) when it is not the last, with the last model's step
    and metrics beside it; else the last one (``checkpoint/``)."""
    if best_step is None or best_step == step:
        return {"model": "last"} if best_step is None else {"model": "last", "best_step": best_step}
    return {"model": "best", "best_step": best_step, "last": {"step": step, **{k: _number(last.get(k)) for k in METRICS}}}
