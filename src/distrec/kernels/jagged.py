"""Copying the bags of selected rows out of a jagged column, or of selected samples out of a
mini-batch, compiled by numba.

A mini-batch of a multi-hot feature is the bags of B random rows (sorted) of a column of
millions of values. As NumPy fancy indexing (one index per value) that gather waits on a
cache miss every few values; copying bag by bag, with the start of the bag a few rows ahead
prefetched, keeps several misses in flight (benchmarks/results/2026-11-27-cpu-kernels.md). The batch is
built on the data loader's thread, beside training on the same cores, so the time saved goes
to training. Selecting samples of a mini-batch (Hotline's popular split) copies their bags
feature by feature in one pass, where torch operators take several.
"""

from __future__ import annotations

import numba
import numpy as np

from distrec.kernels.prefetch import prefetch

BAGS_AHEAD = 8
"""Bags ahead whose first values are prefetched (chosen by timing 4 to 32 bags ahead)."""


@numba.njit(nogil=True, cache=True)
def _copy_bags(values, offsets, rows, out):  # pragma: no cover - compiled
    """Concatenate ``values[offsets[r]:offsets[r + 1]]`` for r in ``rows`` into ``out``."""
    o = 0
    n_rows = rows.shape[0]
    for k in range(n_rows):
        if k + BAGS_AHEAD < n_rows:
            ahead = offsets[rows[k + BAGS_AHEAD]]
            prefetch(values, ahead)
            prefetch(values, ahead + 8)
        start = offsets[rows[k]]
        n = offsets[rows[k] + 1] - start
        out[o : o + n] = values[start : start + n]
        o += n


def gather_bags(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bags of ``rows`` (int64 [n]) of a jagged column (``values`` [nnz], int64 ``offsets``
    [N + 1]): their concatenated values, in the order of ``rows``, and lengths int64 [n]."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    out = np.empty(int(lengths.sum()), values.dtype)
    _copy_bags(values, offsets, rows, out)
    return out, lengths


@numba.njit(nogil=True, cache=True)
def _select_bags(values, offsets, num_features, batch_size, rows, out_values, out_offsets, positions):  # pragma: no cover - compiled
    """The bags of samples ``rows`` of every feature of a feature-major batch, feature after
    feature, with the position in ``values`` of every index copied."""
    o = 0
    n = rows.shape[0]
    for f in range(num_features):
        for j in range(n):
            bag = f * batch_size + rows[j]
            for k in range(offsets[bag], offsets[bag + 1]):
                out_values[o] = values[k]
                positions[o] = k
                o += 1
            out_offsets[f * n + j + 1] = o


def select_bags(values: np.ndarray, offsets: np.ndarray, batch_size: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The samples ``rows`` (int64 [b'], each in [0, B)) of a feature-major jagged batch (bag
    ``f * B + b``; ``values`` [nnz], int64 ``offsets`` [F * B + 1]), in the order of ``rows``:
    their values, offsets int64 [F * b' + 1] and the position in ``values`` of each value,
    int64. Raises IndexError for a row outside the batch."""
    if rows.size and (rows.min() < 0 or rows.max() >= batch_size):
        raise IndexError(f"rows must lie in [0, {batch_size})")
    num_features = (offsets.shape[0] - 1) // max(batch_size, 1)
    nnz = int(np.diff(offsets).reshape(num_features, batch_size)[:, rows].sum()) if batch_size else 0
    out_values = np.empty(nnz, values.dtype)
    out_offsets = np.zeros(num_features * rows.shape[0] + 1, np.int64)
    positions = np.empty(nnz, np.int64)
    _select_bags(values, offsets, num_features, batch_size, rows, out_values, out_offsets, positions)
    return out_values, out_offsets, positions
