"""Distributed Hotline's hot lookups, compiled by numba: finding them in one pass, and their
backward.

Distributed Hotline asks of every mini-batch, before anything else runs: which indices are
hot rows and where they sit in the hot table, which samples are popular (every index hot),
and which hot rows the rank touches. In torch operators that is a global id per index, a
binary search of all of them, a scatter to the samples and one to the hot rows, each a pass
over the batch with its own temporaries. Here one compiled call answers all four: a pass that
searches each index among its own table's hot rows only (a shorter search), several indices
side by side, then a pass over the bags. The backward adds each lookup's
bag gradient straight to its row of a [H, D] buffer, in order, with no sort.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from distrec.kernels.bags import IndexOutsideTable
from distrec.kernels.rows import numpy_views

SEARCH_BLOCK = 16
"""Indices searched side by side: their binary searches are independent chains of loads, which
the CPU overlaps, where one search alone waits on each load in turn (timings in docs/hotline.md)."""


@numba.njit(nogil=True, cache=True)
def _find(values, offsets, batch_size, table_base, table_rows, hot_ids, hot_start, positions, popular, touched):  # pragma: no cover - compiled
    """Fill ``positions`` (-1 where cold), clear ``popular[b]`` of samples with a cold index and
    set the bit of every looked-up hot row in ``touched``; returns the first index outside its
    table, or -1."""
    num_features = (offsets.shape[0] - 1) // batch_size
    base = np.empty(SEARCH_BLOCK, np.int64)
    row = np.empty(SEARCH_BLOCK, np.int64)
    for f in range(num_features):
        # the last hot id <= row among the table's own hot ids, without branches (a select per
        # halving); every index of the table takes the same number of halvings
        first, end = hot_start[f], hot_start[f + 1]
        lo, hi = offsets[f * batch_size], offsets[(f + 1) * batch_size]
        for s in range(lo, hi, SEARCH_BLOCK):
            m = min(SEARCH_BLOCK, hi - s)
            for i in range(m):
                v = values[s + i]
                if v < 0 or v >= table_rows[f]:
                    return s + i
                base[i] = first
                row[i] = table_base[f] + v
            n = end - first
            while n > 1:
                half = n >> 1
                for i in range(m):
                    base[i] = base[i] + half if hot_ids[base[i] + half] <= row[i] else base[i]
                n -= half
            for i in range(m):
                positions[s + i] = base[i] if n == 1 and hot_ids[base[i]] == row[i] else -1
    for bag in range(offsets.shape[0] - 1):
        sample = bag % batch_size
        for k in range(offsets[bag], offsets[bag + 1]):
            p = positions[k]
            if p < 0:
                popular[sample] = False
            else:
                touched[p >> 3] |= np.uint8(1 << (p & 7))
    return -1


def find_hot(
    values: torch.Tensor, offsets: torch.Tensor, batch_size: int, table_base: torch.Tensor, hot_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The hot lookups of a feature-major batch (bag ``f * B + b``, feature f looks up table f).

    Args:
        values: int64 [nnz] rows, local to each bag's table.
        offsets: int64 [F * B + 1] bag boundaries.
        batch_size: B (at least 1).
        table_base: int64 [F + 1] first global id of each table, and the total.
        hot_ids: int64 [H] ascending global ids of the hot rows.

    Returns:
        Each index's row in the hot table, or -1, int64 [nnz]; whether each sample's every
        index is hot, bool [B]; one bit per hot row looked up (bit ``p % 8`` of byte
        ``p // 8``), uint8 [ceil(H / 8)]. Raises ``IndexOutsideTable``.
    """
    hot_start = torch.searchsorted(hot_ids, table_base)
    positions = torch.empty_like(values)
    popular = torch.ones(batch_size, dtype=torch.bool)
    touched = torch.zeros((hot_ids.numel() + 7) // 8, dtype=torch.uint8)
    table_rows = torch.diff(table_base)
    bad = _find(*numpy_views(values, offsets), batch_size, *numpy_views(table_base, table_rows, hot_ids, hot_start, positions, popular, touched))
    if bad >= 0:
        raise IndexOutsideTable(bad)
    return positions, popular, touched


@numba.njit(nogil=True, cache=True)
def _add_picked(out, rows, picks, source):  # pragma: no cover - compiled
    """``out[rows[k]] += source[picks[k]]`` for every k, in order."""
    for k in range(rows.shape[0]):
        r, p = rows[k], picks[k]
        for d in range(out.shape[1]):
            out[r, d] += source[p, d]


def add_picked_rows(out: torch.Tensor, rows: torch.Tensor, picks: torch.Tensor, source: torch.Tensor) -> None:
    """``out[rows[k]] += source[picks[k]]`` for every k (rows may repeat; added in order): the
    hot lookups' backward, each lookup's bag gradient added to its hot row with no gradient
    per lookup made and no sort.

    Args:
        out: float [H, D], updated in place.
        rows: int64 [n] rows of ``out``.
        picks: int64 [n] rows of ``source``.
        source: [bags, D], the dtype of ``out``, contiguous.
    """
    _add_picked(*numpy_views(out, rows, picks, source))
