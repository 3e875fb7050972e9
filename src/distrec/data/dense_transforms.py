"""Per-column transforms of the dense columns of CSV and Parquet data, fitted on the training rows.

A schema names one transform per dense column (``distrec.data.tabular``):

- ``log1p``: ``log(1 + max(x, 0))``, as distrec reads Criteo's counts;
- ``standardize``: ``(x - mean) / std`` with the mean and standard deviation of the column over
  the run's training rows (std 1 when the column is constant);
- ``none``: the value as it is;
- ``auto`` (the default): ``log1p`` when no training row of the column is negative (counts,
  prices, durations: heavy-tailed, where a log keeps a value in the thousands from swamping the
  model's first layer), else ``standardize`` (a log would flatten every negative value to 0).

The cache keeps the raw values; a run fits its transforms once on its training rows when it
starts (the same numbers on every rank and at every resume) and saves them in its checkpoints,
so ``evaluate``, ``predict`` and ``export`` feed a model the numbers it was trained on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

TRANSFORMS = ("auto", "log1p", "standardize", "none")
"""What a schema may ask of a dense column."""

FIT_ROWS = 1 << 20
"""Rows gathered at a time while fitting (float64 [FIT_ROWS, columns] at most)."""


@dataclass(frozen=True)
class DenseTransform:
    """The fitted transform of one dense column: ``kind`` log1p, standardize or none, and for
    standardize the training rows' ``mean`` and ``std``."""

    name: str
    kind: str
    mean: float = 0.0
    std: float = 1.0

    def to_dict(self) -> dict:
        return {"name": self.name, "transform": self.kind, "mean": self.mean, "std": self.std}

    @classmethod
    def from_dict(cls, d: dict) -> DenseTransform:
        return cls(str(d["name"]), str(d["transform"]), float(d["mean"]), float(d["std"]))

    def describe(self) -> str:
        """The transform in words and numbers (for an exported model's JSON)."""
        if self.kind == "log1p":
            return "log(1 + max(x, 0)) of the column's number x; missing = 0 before the transform"
        if self.kind == "standardize":
            return f"(x - {self.mean!r}) / {self.std!r}: the column's number x standardised over the training rows; missing = 0 before the transform"
        return "the column's number as float32; missing = 0"


def fit(names: list[str], requested: list[str], blocks: Callable[[], Iterator[np.ndarray]]) -> list[DenseTransform]:
    """The transforms of the columns ``names`` asked for as ``requested`` (one of ``TRANSFORMS``
    each), fitted on the training rows' values: ``blocks()`` yields them as float32 [n, columns]
    blocks (it is read twice: the mean, then the spread around it)."""
    count, total, squares = 0, np.zeros(len(names)), np.zeros(len(names))
    lowest = np.full(len(names), np.inf)
    for block in blocks():
        values = np.asarray(block, np.float64)
        count += values.shape[0]
        total += values.sum(axis=0)
        lowest = np.minimum(lowest, values.min(axis=0, initial=np.inf))
    mean = total / max(count, 1)
    for block in blocks() if count else ():
        squares += ((np.asarray(block, np.float64) - mean) ** 2).sum(axis=0)
    std = np.sqrt(squares / max(count, 1))
    fitted = []
    for j, (name, kind) in enumerate(zip(names, requested)):
        if kind == "auto":
            kind = "log1p" if lowest[j] >= 0 else "standardize"
        if kind == "standardize":
            fitted.append(DenseTransform(name, kind, float(mean[j]), float(std[j]) if std[j] > 0 else 1.0))
        else:
            fitted.append(DenseTransform(name, kind))
    return fitted


def apply(transforms: list[DenseTransform], dense: np.ndarray) -> None:
    """Transform the columns of ``dense`` (float32 [n, columns]) in place."""
    for j, t in enumerate(transforms):
        if t.kind == "log1p":
            np.log1p(np.maximum(dense[:, j], 0.0), out=dense[:, j])
        elif t.kind == "standardize":
            dense[:, j] = (dense[:, j].astype(np.float64) - t.mean) / t.std
