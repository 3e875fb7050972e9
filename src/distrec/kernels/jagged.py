"""Copying the bags of selected rows out of a jagged column, compiled by numba.

A mini-batch of a multi-hot feature is the bags of B random rows (sorted) of a column of
millions of values. As NumPy fancy indexing (one index per value) that gather waits on a
cache miss every few values; copying bag by bag, with the start of the bag a few rows ahead
prefetched, keeps several misses in flight (timings in ``docs/performance.md``). The batch is
built on the data loader's thread, beside training on the same cores, so the time saved goes
to training.
"""

from __future__ import annotations

import numba
import numpy as np

from distrec.kernels.prefetch import prefetch

BAGS_AHEAD = 8
"""Bags ahead whose first values are prefetched (chosen by timing 4-32 on this machine)."""


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
