"""Table statistics measured from a prepared data set, for ``distrec plan --data``."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from distrec.data import Dataset
from distrec.errors import DistrecError
from distrec.planner.features import table_spec_from_indices
from distrec.planner.types import TableSpec

DEFAULT_SAMPLE_ROWS = 262_144
"""Rows read to measure pooling factors and histograms (the first rows of the data set)."""


def table_specs_from_dataset(dataset: Dataset, dim: int, batch_size: int, sample_rows: int = DEFAULT_SAMPLE_ROWS, progress: bool = True) -> list[TableSpec]:
    """One TableSpec per sparse feature: the table's rows (as training sizes them), ``dim``, and
    the mean pooling factor and reuse-factor histogram of the first ``sample_rows`` rows.

    Indices are the table rows training looks up (after hashing into the table), and reuse
    counts restart every ``batch_size`` samples, as in one training batch.

    Args:
        dataset: the prepared data set.
        dim: embedding dimension of every table.
        batch_size: samples per training batch.
        sample_rows: rows to read at most.
        progress: show a tqdm bar (rows/s).
    """
    if dataset.num_rows == 0 or not dataset.features:
        raise DistrecError("the data set has no rows or no sparse features; nothing to plan")
    if batch_size < 1:
        raise DistrecError(f"batch size {batch_size} must be at least 1")
    num_features = len(dataset.features)
    rows = np.arange(min(dataset.num_rows, sample_rows), dtype=np.int64)
    values: list[list[np.ndarray]] = [[] for _ in range(num_features)]
    lengths: list[list[np.ndarray]] = [[] for _ in range(num_features)]
    with tqdm(total=rows.size, desc="measuring tables", unit="rows", unit_scale=True, disable=not progress) as bar:
        for batch in dataset.batches(rows, batch_size, shuffle=False):
            batch_lengths = batch.lengths().numpy()
            for f in range(num_features):
                values[f].append(batch.feature_values(f).numpy())
                lengths[f].append(batch_lengths[f])
            bar.update(batch.batch_size)
    specs = []
    for f, feature in enumerate(dataset.features):
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths[f]))])
        specs.append(table_spec_from_indices(feature.name, np.concatenate(values[f]), offsets, dataset.table_rows[feature.name], dim, batch_size))
    return specs
