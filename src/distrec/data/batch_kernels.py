"""Copying the bags of cached rows into a mini-batch, their raw ids mapped to table rows on the
way, compiled by numba.

A batch of B rows and F features gathers F x B bags from memory-mapped columns in random order
and maps every raw id into its table. In NumPy that was a gather per feature, six passes of
the mapping (a remainder by subtraction, division and multiplication, as fast as NumPy does
it) and a concatenation: at 65,536 rows x 26 features x 20 ids (272 MB of ids) 0.23-0.34 s
here. These kernels read each id from its bag, map it and write it at its place in the batch
once, with every cache line of the bag 8 ahead prefetched (prefetching its first two lines
only, as ``distrec.kernels.jagged`` does, took 0.20 s instead of 0.15 s for the bags of that
batch: 20 ids span three lines). The remainder uses no integer division (tens of cycles
each): two float64 estimates of the quotient, each exact to one, then one correction.
"""

from __future__ import annotations

import numba
import numpy as np

from distrec.kernels.prefetch import prefetch

BAGS_AHEAD = 8
"""Bags ahead whose values are prefetched (8, 16 and 32 measured alike)."""
_IDS_PER_LINE = 8  # int64 ids in a 64-byte cache line


@numba.njit(inline="always")
def table_row(raw, rows_minus_one, inverse):  # pragma: no cover - compiled
    """The table row of raw id ``raw`` (>= 0) in a table of ``rows_minus_one + 1`` rows: 0 stays
    0, others wrap into rows 1..rows-1 as ``1 + (raw - 1) % rows_minus_one``; ``rows_minus_one``
    0 keeps the id (it already fits its table). ``inverse`` is ``1 / rows_minus_one``."""
    if rows_minus_one == 0 or raw == 0:
        return raw
    d = rows_minus_one
    y = raw - 1
    # the first estimate of y // d is within 3 * 2**10 / d + 1 of it, so the remainder left is
    # below 2**11 + 2d in size and exact in float64; the second estimate is within one
    r = y - np.int64(np.float64(y) * inverse) * d
    r -= np.int64(np.floor(np.float64(r) * inverse)) * d
    if r < 0:
        r += d
    elif r >= d:
        r -= d
    return 1 + r


@numba.njit(nogil=True, cache=True)
def map_rows(raw, rows_minus_one, out):  # pragma: no cover - compiled
    """``out[i] = table_row(raw[i])`` for every id of ``raw`` (int64 [n])."""
    inverse = 1.0 / rows_minus_one if rows_minus_one else 0.0
    for i in range(raw.shape[0]):
        out[i] = table_row(raw[i], rows_minus_one, inverse)


@numba.njit(nogil=True, cache=True)
def scatter_bags(values, offsets, rows, dest, out, rows_minus_one):  # pragma: no cover - compiled
    """Write the bag of each row ``rows[k]`` of a multi-hot column (``values`` [nnz], int64
    ``offsets`` [N + 1]) at ``out[dest[k]:]``, its ids mapped by :func:`table_row`."""
    inverse = 1.0 / rows_minus_one if rows_minus_one else 0.0
    n_rows = rows.shape[0]
    for k in range(n_rows):
        if k + BAGS_AHEAD < n_rows:  # every cache line of the bag 8 ahead (20 ids span 3 lines)
            ahead, end = offsets[rows[k + BAGS_AHEAD]], offsets[rows[k + BAGS_AHEAD] + 1]
            while ahead < end:
                prefetch(values, ahead)
                ahead += _IDS_PER_LINE
        start = offsets[rows[k]]
        o = dest[k]
        for j in range(offsets[rows[k] + 1] - start):
            out[o + j] = table_row(values[start + j], rows_minus_one, inverse)


@numba.njit(nogil=True, cache=True)
def scatter_ids(values, rows, dest, out, rows_minus_one):  # pragma: no cover - compiled
    """Write the id of each row ``rows[k]`` of a single-hot column (``values`` [N]) at
    ``out[dest[k]]``, mapped by :func:`table_row`."""
    inverse = 1.0 / rows_minus_one if rows_minus_one else 0.0
    n_rows = rows.shape[0]
    for k in range(n_rows):
        if k + BAGS_AHEAD < n_rows:
            prefetch(values, rows[k + BAGS_AHEAD])
        out[dest[k]] = table_row(values[rows[k]], rows_minus_one, inverse)
