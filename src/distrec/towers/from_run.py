"""The tower partitioner's input from a trained run: a feature-interaction matrix.

Two measures, both ``[F, F]`` with zero diagonal handled by the partitioner:

- ``cosine`` (the DMT paper's): ``|mean over samples of cosine(E_i, E_j)|`` of the pooled
  embeddings (``distrec.towers.partition.interaction_matrix``).
- ``pairwise``: how much features i and j act on the logit *together*, beyond their
  separate effects: the mean over samples of
  ``|f(x) - f(x with E_i shuffled) - f(x with E_j shuffled) + f(x with both shuffled)|``
  (the numerator of Friedman and Popescu's H statistic, Ann. Appl. Stat. 2008; shuffling a
  feature's pooled embedding across the sample replaces it by a draw from its marginal),
  scaled so that the largest entry is 1.

Why both: the cosine measure sees features whose embeddings point the same way. Features
that interact as in a factorisation machine, ``<v_i, v_j>`` with zero-mean latent vectors
(the synthetic data's planted groups), get embeddings whose mean cosine is near zero
whether they interact or not, so the cosine matrix cannot find such groups; the pairwise
measure finds them (ARI 1.0 in ``tests/test_towers_from_run.py``). It costs F(F-1)/2 + F + 1
forward passes of the model's dense part on the sample.

Example:
    >>> model, batch, names = trained_sample(Path("runs/synthetic"), rows=2048)  # doctest: +SKIP
    >>> interaction = feature_interaction(model, batch, "pairwise")               # doctest: +SKIP
    >>> partition_features(names, 4, "coherent", interaction)                      # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.towers.partition import interaction_matrix

INTERACTIONS = ("pairwise", "cosine")


def trained_sample(
    checkpoint: Path,
    rows: int = 2048,
    seed: int = 0,
    data_path: str | None = None,
    data_format: str | None = None,
    progress: bool = True,
) -> tuple[nn.Module, Batch, list[str]]:
    """A trained model (on CPU, eval mode), a random sample of data rows and the feature names.

    Args:
        checkpoint: a run directory (or its ``checkpoint/`` folder).
        rows: samples to draw (all rows if the data set is smaller).
        seed: seed of the sample.
        data_path, data_format: other data in the run's format (default: the run's data).
        progress: progress bar while the data is prepared.
    """
    from distrec.data import Dataset, prepare
    from distrec.train.evaluate import load_trained_model

    if rows < 2:
        raise DistrecError(f"--sample-rows {rows} is too small; use at least 2 (2048 is a good default)")
    model, cfg, tables, _ = load_trained_model(checkpoint, torch.device("cpu"))
    if data_path is not None:
        cfg.data.path, cfg.data.format = data_path, data_format or cfg.data.format
    dataset = Dataset(prepare(cfg.data, progress=progress), cfg.data)
    names = [t.name for t in tables]
    if dataset.feature_names != names:
        raise DistrecError("the sample data has different features than the model was trained on; use the run's data format")
    dataset.override_tables(tables)
    chosen = np.random.default_rng(seed).permutation(dataset.num_rows)[:rows]
    return model.eval(), dataset.batch(np.sort(chosen)), names


class _Pooled(nn.Module):
    """Stands in for a model's embedding module: returns fixed pooled embeddings."""

    def __init__(self, pooled: torch.Tensor) -> None:
        super().__init__()
        self.pooled = pooled

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.pooled


@torch.no_grad()
def pairwise_interaction(model: nn.Module, batch: Batch, seed: int = 0) -> torch.Tensor:
    """``[F, F]`` mean |joint effect| of each feature pair on the logit, largest entry 1.

    ``model`` must have an ``embeddings`` module (``distrec.models.base.RecommendationModel``);
    it is swapped for fixed pooled embeddings during the computation and restored.
    """
    original = model.embeddings
    pooled = original(batch)
    num = pooled.shape[1]
    shuffled = pooled[torch.randperm(pooled.shape[0], generator=torch.Generator().manual_seed(seed))]

    def logits(features: tuple[int, ...]) -> torch.Tensor:
        x = pooled.clone()
        x[:, list(features)] = shuffled[:, list(features)]
        model.embeddings = _Pooled(x)
        return model(batch)

    try:
        base = logits(())
        alone = [logits((i,)) for i in range(num)]
        joint = torch.zeros(num, num, dtype=torch.float64)
        for i in range(num):
            for j in range(i + 1, num):
                effect = (base - alone[i] - alone[j] + logits((i, j))).abs().mean()
                joint[i, j] = joint[j, i] = float(effect)
    finally:
        model.embeddings = original
    top = joint.max()
    return (joint / top if top > 0 else joint).float()


def feature_interaction(model: nn.Module, batch: Batch, method: str = "pairwise", seed: int = 0) -> torch.Tensor:
    """``[F, F]`` interaction matrix of a trained model on ``batch`` by ``method`` (see module doc)."""
    if method == "pairwise":
        return pairwise_interaction(model, batch, seed)
    if method == "cosine":
        with torch.no_grad():
            return interaction_matrix(model.embeddings(batch))
    raise DistrecError(f"unknown interaction measure {method!r}; choose one of: {', '.join(INTERACTIONS)}")
