"""Distributed Hotline's hot lookups, compiled by numba: finding them in one pass, splitting a
mini-batch by them, and their backward.

Distributed Hotline asks of every mini-batch, before anything else runs: which indices are
hot rows and where they sit in the hot table, which samples are popular (every index hot),
and which hot rows the rank touches. In torch operators that is a global id per index, a
binary search of all of them, a scatter to the samples and one to the hot rows, each a pass
over the batch with its own temporaries. Here one compiled call answers all four: a pass that
searches each index among its own table's hot rows only (a shorter search), several indices
side by side, then a pass over the bags. A second call copies the popular and the other
samples' bags out, each micro-batch's hot lookups with their bags and the other samples' cold
indices, in one pass where torch operators take a dozen. The backward adds each lookup's
bag gradient straight to its row of a [H, D] buffer, in order, with no sort; the gradient
sync reads the touched rows' bits and moves those rows into its all-reduce buffer.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from distrec.kernels.bags import IndexOutsideTable
from distrec.kernels.rows import numpy_views

SEARCH_BLOCK = 16
"""Indices searched side by side: their binary searches are independent chains of loads, which
the CPU overlaps, where one search alone waits on each load in turn
(benchmarks/results/2026-11-27-hotline-distributed.md)."""


@numba.njit(nogil=True, cache=True)
def _find(values, offsets, batch_size, table_base, table_rows, hot_ids, hot_start, positions, popular, touched, cold_features):  # pragma: no cover - compiled
    """Fill ``positions`` (-1 where cold), clear ``popular[b]`` of samples with a cold index,
    set the bit of every looked-up hot row in ``touched`` and of every feature with a cold
    index in ``cold_features``; returns the first index outside its table, or -1."""
    num_features = (offsets.shape[0] - 1) // batch_size
    base = np.empty(SEARCH_BLOCK, np.int64)
    row = np.empty(SEARCH_BLOCK, np.int64)
    for f in range(num_features):
        first, end = hot_start[f], hot_start[f + 1]
        lo, hi = offsets[f * batch_size], offsets[(f + 1) * batch_size]
        if end - first == table_rows[f]:  # every row of the table is hot: row v sits at first + v
            for k in range(lo, hi):
                v = values[k]
                if v < 0 or v >= table_rows[f]:
                    return k
                positions[k] = first + v
            continue
        # the last hot id <= row among the table's own hot ids, without branches (a select per
        # halving); every index of the table takes the same number of halvings
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
                f = bag // batch_size
                cold_features[f >> 3] |= np.uint8(1 << (f & 7))
            else:
                touched[p >> 3] |= np.uint8(1 << (p & 7))
    return -1


def find_hot(
    values: torch.Tensor, offsets: torch.Tensor, batch_size: int, table_base: torch.Tensor, hot_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The hot lookups of a feature-major batch (bag ``f * B + b``, feature f looks up table f);
    a table whose every row is hot is read without a search.

    Args:
        values: int64 [nnz] rows, local to each bag's table.
        offsets: int64 [F * B + 1] bag boundaries.
        batch_size: B (at least 1).
        table_base: int64 [F + 1] first global id of each table, and the total.
        hot_ids: int64 [H] ascending global ids of the hot rows.

    Returns:
        Each index's row in the hot table, or -1, int64 [nnz]; whether each sample's every
        index is hot, bool [B]; one bit per hot row looked up (bit ``p % 8`` of byte
        ``p // 8``), uint8 [ceil(H / 8)]; one bit per feature with an index not hot, uint8
        [ceil(F / 8)]. Raises ``IndexOutsideTable``.
    """
    hot_start = torch.searchsorted(hot_ids, table_base)
    positions = torch.empty_like(values)
    popular = torch.ones(batch_size, dtype=torch.bool)
    touched = torch.zeros((hot_ids.numel() + 7) // 8, dtype=torch.uint8)
    num_features = table_base.numel() - 1
    cold_features = torch.zeros((num_features + 7) // 8, dtype=torch.uint8)
    table_rows = torch.diff(table_base)
    views = numpy_views(table_base, table_rows, hot_ids, hot_start, positions, popular, touched, cold_features)
    bad = _find(*numpy_views(values, offsets), batch_size, *views)
    if bad >= 0:
        raise IndexOutsideTable(bad)
    return positions, popular, touched, cold_features


@numba.njit(nogil=True, cache=True)
def _split(values, offsets, batch_size, positions, popular, popular_out, other_out, other_hot, other_cold):  # pragma: no cover - compiled
    """Copy every bag, feature after feature and sample after sample, into the popular
    micro-batch's arrays (``popular_out``: values, hot rows, bag of each, offsets) or the other
    one's (``other_out``: values, offsets; ``other_hot``: hot rows, bag of each, offsets;
    ``other_cold``: cold values, offsets); returns how many indices each of the four got."""
    pop_values, pop_rows, pop_bag_of, pop_offsets = popular_out
    oth_values, oth_offsets = other_out
    hot_rows, hot_bag_of, hot_offsets = other_hot
    cold_values, cold_offsets = other_cold
    num_features = (offsets.shape[0] - 1) // batch_size
    p = o = h = c = 0
    pop_bag = oth_bag = 0
    for f in range(num_features):
        for b in range(batch_size):
            bag = f * batch_size + b
            if popular[b]:
                for k in range(offsets[bag], offsets[bag + 1]):
                    pop_values[p] = values[k]
                    pop_rows[p] = positions[k]
                    pop_bag_of[p] = pop_bag
                    p += 1
                pop_bag += 1
                pop_offsets[pop_bag] = p
            else:
                for k in range(offsets[bag], offsets[bag + 1]):
                    oth_values[o] = values[k]
                    o += 1
                    if positions[k] >= 0:
                        hot_rows[h] = positions[k]
                        hot_bag_of[h] = oth_bag
                        h += 1
                    else:
                        cold_values[c] = values[k]
                        c += 1
                oth_bag += 1
                oth_offsets[oth_bag] = o
                hot_offsets[oth_bag] = h
                cold_offsets[oth_bag] = c
    return p, o, h, c


Group = tuple[torch.Tensor, ...]


def split_lookups(
    values: torch.Tensor, offsets: torch.Tensor, batch_size: int, positions: torch.Tensor, popular: torch.Tensor
) -> tuple[Group, Group, Group, Group]:
    """A feature-major batch's bags split between its popular samples and the others, each
    part in the batch's order.

    Args:
        values: int64 [nnz] rows, local to each bag's table.
        offsets: int64 [F * B + 1] bag boundaries.
        batch_size: B (at least 1).
        positions: int64 [nnz], each index's row in the hot table, -1 where cold (``find_hot``).
        popular: bool [B], whether each sample's every index is hot.

    Returns:
        Four groups of int64 tensors, every offsets [F * b + 1] over the part's b samples:
        the popular samples' (values, hot rows, bag of each, offsets); the other samples'
        (values, offsets); their hot lookups' (rows, bag of each, offsets); their cold
        indices' (values, offsets).
    """
    num_features = (offsets.numel() - 1) // batch_size
    num_popular = int(popular.sum())
    nnz = values.numel()

    def part(per_index: int, samples: int) -> list[torch.Tensor]:
        return [values.new_empty(nnz) for _ in range(per_index)] + [values.new_zeros(num_features * samples + 1)]

    groups = (part(3, num_popular), part(1, batch_size - num_popular), part(2, batch_size - num_popular), part(1, batch_size - num_popular))
    counts = _split(*numpy_views(values, offsets), batch_size, *numpy_views(positions, popular), *(tuple(numpy_views(*g)) for g in groups))
    return tuple(tuple(t[:n] for t in g[:-1]) + (g[-1],) for g, n in zip(groups, counts))  # type: ignore[return-value]


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


@numba.njit(nogil=True, cache=True)
def _set_bits(packed, count, out):  # pragma: no cover - compiled
    """Write the positions of the set bits among the first ``count`` of ``packed`` to ``out``;
    returns how many."""
    n = 0
    for byte in range((count + 7) >> 3):
        bits = packed[byte]
        if bits:
            for b in range(8):
                p = (byte << 3) + b
                if bits >> b & 1 and p < count:
                    out[n] = p
                    n += 1
    return n


def set_bits(packed: torch.Tensor, count: int) -> torch.Tensor:
    """Positions int64 [n] (ascending) of the set bits among the first ``count`` bits of
    ``packed`` (uint8; bit ``p % 8`` of byte ``p // 8``)."""
    out = torch.empty(count, dtype=torch.int64)
    return out[: _set_bits(*numpy_views(packed), count, *numpy_views(out))]


@numba.njit(nogil=True, cache=True)
def _take_and_clear(source, rows, out):  # pragma: no cover - compiled
    for k in range(rows.shape[0]):
        r = rows[k]
        for d in range(source.shape[1]):
            out[k, d] = source[r, d]
            source[r, d] = 0.0


def take_and_clear_rows(source: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> None:
    """``out[k] = source[rows[k]]``, then those rows of ``source`` zeroed (distinct ``rows``):
    the hot rows' summed gradients moved into the all-reduce's buffer.

    Args:
        source: float [H, D], contiguous, updated in place.
        rows: int64 [n] distinct rows of ``source``.
        out: float [n, D], contiguous, of ``source``'s dtype.
    """
    _take_and_clear(*numpy_views(source, rows, out))
