"""Table features for the cost models: shape, pooling factor and the reuse-factor histogram.

The published DLRM locality statistics (facebookresearch/dlrm_datasets,
``locality_stats_2021_t856.txt``) are called "reuse" histograms, but they do not measure a
reuse *distance*: within one batch they count, for every distinct (table, row), how many
times it is accessed (its "col size", the reuse factor). "Histogram of col sizes" is the
fraction of distinct rows whose count falls in each of 17 doubling bins
(0,1], (1,2], (2,4], ..., (16384,32768], >32768; "Ratio of index distribution" weights each
distinct row by its count (the fraction of accesses). NeuroShard's table features use the
first (fraction of distinct rows), and so does this module by default.
"""

from __future__ import annotations

import numpy as np

from distrec.errors import DistrecError
from distrec.planner.types import NUM_HISTOGRAM_BINS, TableSpec

TABLE_FEATURE_NAMES: tuple[str, ...] = ("dim", "log2_rows", "pooling_factor", "log2_bytes", "lookup_floats") + tuple(
    f"reuse_bin_{i}" for i in range(NUM_HISTOGRAM_BINS)
)


def reuse_counts(indices: np.ndarray, window_ids: np.ndarray | None = None) -> np.ndarray:
    """How often each distinct index is accessed within its window (batch).

    Args:
        indices: int [n] row indices in stream order.
        window_ids: int [n] batch number of each access, non-decreasing or not; None means
            the whole stream is one batch.

    Returns:
        int64 [distinct (window, index) pairs] access counts, each >= 1.
    """
    idx = np.asarray(indices, dtype=np.int64).ravel()
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    if window_ids is None:
        _, counts = np.unique(idx, return_counts=True)
        return counts
    win = np.asarray(window_ids, dtype=np.int64).ravel()
    order = np.lexsort((idx, win))
    s_idx, s_win = idx[order], win[order]
    starts = np.flatnonzero(np.r_[True, (s_idx[1:] != s_idx[:-1]) | (s_win[1:] != s_win[:-1])])
    return np.diff(np.r_[starts, idx.size])


def reuse_bin(counts: np.ndarray) -> np.ndarray:
    """The histogram bin of each access count: 0 for 1, k for (2**(k-1), 2**k], 16 above 32768."""
    return np.minimum(np.ceil(np.log2(np.asarray(counts, dtype=np.float64))), NUM_HISTOGRAM_BINS - 1).astype(np.int64)


def reuse_histogram(indices: np.ndarray, window_ids: np.ndarray | None = None, weight_by_accesses: bool = False) -> np.ndarray:
    """The 17-bin reuse-factor histogram of an index stream, as in the DLRM locality stats.

    Args:
        indices: int [n] row indices.
        window_ids: int [n] batch of each access (counts restart in every batch); None = one batch.
        weight_by_accesses: False gives the fraction of distinct rows per bin ("Histogram of
            col sizes", NeuroShard's feature); True the fraction of accesses ("Ratio of index
            distribution").

    Returns:
        float64 [17] fractions summing to 1 (all zero for an empty stream).

    Example:
        >>> reuse_histogram(np.array([5, 5, 5, 7]))[:3]  # row 7 once, row 5 three times
        array([0.5, 0. , 0.5])
    """
    counts = reuse_counts(indices, window_ids)
    hist = np.bincount(reuse_bin(counts), weights=counts if weight_by_accesses else None, minlength=NUM_HISTOGRAM_BINS)
    total = hist.sum()
    return hist / total if total > 0 else hist.astype(np.float64)


def table_spec_from_indices(name: str, values: np.ndarray, offsets: np.ndarray, num_rows: int, dim: int, batch_size: int) -> TableSpec:
    """Measure one feature's TableSpec from its jagged index stream.

    Args:
        name: table name.
        values: int [nnz] row indices of all samples, in sample order.
        offsets: int [samples + 1] bag boundaries into ``values``.
        num_rows: rows of the table.
        dim: embedding dimension.
        batch_size: samples per training batch; reuse counts restart every ``batch_size`` samples.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    num_samples = offsets.size - 1
    if num_samples < 1 or offsets[0] != 0 or offsets[-1] != values.size or np.any(np.diff(offsets) < 0):
        raise DistrecError(f"feature {name!r} has malformed offsets; they must start at 0, never decrease and end at the value count")
    if values.size and (values.min() < 0 or values.max() >= num_rows):
        raise DistrecError(f"feature {name!r} has indices outside 0..{num_rows - 1}; rebuild the data cache")
    sample_of_access = np.repeat(np.arange(num_samples, dtype=np.int64), np.diff(offsets))
    hist = reuse_histogram(values, sample_of_access // batch_size)
    if hist.sum() == 0:
        hist[0] = 1.0  # a feature with no accesses: every (imaginary) row is touched at most once
    return TableSpec(name, num_rows, dim, values.size / num_samples, tuple(hist))


def feature_matrix(tables: list[TableSpec]) -> np.ndarray:
    """The cost models' input for each table (or column shard): float32 [n, 22].

    Columns (``TABLE_FEATURE_NAMES``): dimension, log2 rows, mean pooling factor, log2 bytes,
    floats looked up per sample (dim x pooling factor), then the 17 histogram fractions.
    Sizes enter as logarithms because they span six orders of magnitude; the cost models
    standardise every column. The lookup floats are NeuroShard's features multiplied out:
    a lookup's work is nearly proportional to them, and a per-table MLP summed over a
    device learns that product poorly from a few hundred samples.
    """
    if not tables:
        return np.zeros((0, len(TABLE_FEATURE_NAMES)), dtype=np.float32)
    shape = np.array([(t.dim, t.num_rows, t.pooling_factor, t.num_bytes) for t in tables], dtype=np.float64)
    hist = np.array([t.histogram for t in tables], dtype=np.float64)
    out = np.column_stack([shape[:, 0], np.log2(shape[:, 1]), shape[:, 2], np.log2(shape[:, 3]), shape[:, 0] * shape[:, 2], hist])
    return out.astype(np.float32)
