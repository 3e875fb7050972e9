"""Pooling of jagged multi-hot bags straight from their tables, and the grouping of their
lookups by row for the backward, compiled by numba.

In torch operators a multi-hot lookup first makes every index a row of the fused weight (one
[nnz] shift), pools, then transposes the pooled vectors to sample-major [B, F, D]; its backward
sorts all nnz rows at once and gathers the bag of each sorted entry. At 20 indices per bag that
preparation costs about as much as the pooling itself. Here bags come in ``Segments``: runs of
bags that all look up one table, with the output row of each bag given by an affine rule, so
that the pooling writes each bag's vector where the model wants it and reads the indices as
the batch holds them. The backward groups each table's lookups apart, tables in parallel
(distinct tables never share a row): by counting its rows when the table has few rows per
lookup (multi-hot batches of tables of up to a few hundred thousand rows), else by a stable
radix sort of its local rows; both stay in cache.

The pooled sums add each bag's rows in order, as ``embedding_bag`` does, and the grouping keeps
each row's lookups in order, as a stable sort of all rows does: the results are bit for bit
those of the torch operators (``tests/test_kernels_bags.py``). CPU tensors only.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numba
import numpy as np
import torch

from distrec.kernels import rows as row_kernels
from distrec.kernels.accumulators import stack_vector
from distrec.kernels.prefetch import PREFETCH_DISTANCE, prefetch
from distrec.kernels.rows import numpy_views, split_over_threads

DIGIT_BITS = 11
"""Bits of a row sorted per radix pass: 2,048 buckets, whose counts stay in the L1 cache."""
COUNTING_SORT_ROWS_PER_LOOKUP = 4
"""A table's lookups are grouped by counting its rows when it has at most this many rows per
lookup (the pass over the rows costs less than the radix sort's passes over the lookups)."""


class IndexOutsideTable(ValueError):
    """An index of a bag lies outside its table; ``position`` is its place in ``values``."""

    def __init__(self, position: int) -> None:
        super().__init__(f"index at position {position} lies outside its table")
        self.position = position


class Segments(NamedTuple):
    """Jagged bags in segments, each a run of bags that look up one table.

    Attributes:
        values: int64 [nnz] rows, local to each bag's table.
        offsets: int64 [bags + 1] bag boundaries into ``values``.
        bag_start: int64 [S + 1] the bags of segment s are ``bag_start[s]:bag_start[s + 1]``.
        table: int64 [S] the table segment s looks up.
        out_start: int64 [S] output row of segment s's first bag.
        out_stride: int64 [S] output rows between its consecutive bags.
        table_base: int64 [T] first row of each table in the weight, increasing.
        table_rows: int64 [T] rows of each table.
        num_out: output rows (bags are written to distinct output rows).
    """

    values: torch.Tensor
    offsets: torch.Tensor
    bag_start: torch.Tensor
    table: torch.Tensor
    out_start: torch.Tensor
    out_stride: torch.Tensor
    table_base: torch.Tensor
    table_rows: torch.Tensor
    num_out: int


def feature_segments(values: torch.Tensor, offsets: torch.Tensor, table_base: torch.Tensor, table_rows: torch.Tensor) -> Segments:
    """A feature-major batch (bag ``f * B + b``, feature f looks up table f) as segments that
    pool to sample-major [B * F] output rows (bag ``f * B + b`` to row ``b * F + f``)."""
    num_features = table_base.numel()
    batch_size = (offsets.numel() - 1) // num_features
    features = torch.arange(num_features, dtype=torch.int64)
    return Segments(
        values,
        offsets,
        torch.arange(num_features + 1, dtype=torch.int64) * batch_size,
        features,
        features,
        torch.full((num_features,), num_features, dtype=torch.int64),
        table_base,
        table_rows,
        batch_size * num_features,
    )


@functools.cache
def _pool_kernel(dim: int):
    """The pooling compiled for rows of ``dim`` floats (each bag's sum in registers)."""

    @numba.njit(nogil=True, cache=True)
    def pool_segments(
        weight, values, offsets, bag_start, table, out_start, out_stride, table_base, table_rows, out, first, last
    ):  # pragma: no cover - compiled
        """Pool segments [first, last) into ``out``; returns the first out-of-table entry, or -1."""
        total = stack_vector(dim, out)
        for s in range(first, last):
            base, rows = table_base[table[s]], table_rows[table[s]]
            end = offsets[bag_start[s + 1]]
            for bag in range(bag_start[s], bag_start[s + 1]):
                for d in range(dim):
                    total[d] = 0.0
                for k in range(offsets[bag], offsets[bag + 1]):
                    if k + PREFETCH_DISTANCE < end:
                        ahead = values[k + PREFETCH_DISTANCE]
                        if 0 <= ahead < rows:
                            prefetch(weight, base + ahead)
                    v = values[k]
                    if v < 0 or v >= rows:
                        return k
                    r = base + v
                    for d in range(dim):
                        total[d] += weight[r, d]
                o = out_start[s] + (bag - bag_start[s]) * out_stride[s]
                for d in range(dim):
                    out[o, d] = total[d]
        return -1

    return pool_segments


@numba.njit(nogil=True, cache=True)
def _group(
    values,
    offsets,
    bag_start,
    out_start,
    out_stride,
    table_segments,
    segment_ptr,
    table_base,
    table_rows,
    entry_start,
    rows,
    bounds,
    picks,
    distinct,
    first,
    last,
):  # pragma: no cover - compiled
    """Group the lookups of tables [first, last) by row.

    Table t's lookups fill ``picks[entry_start[t]:entry_start[t + 1]]`` with their output rows,
    row by row (rows increasing, each row's lookups in order); its ``distinct[t]`` rows go to
    ``rows[entry_start[t]:]`` and the start of each row's lookups to ``bounds[entry_start[t]:]``.
    A table with at most ``COUNTING_SORT_ROWS_PER_LOOKUP`` rows per lookup is grouped by
    counting its rows (one pass to count, one over the rows, one to place); a larger one by
    a radix sort of its lookups.
    """
    counted = np.empty(0, np.int32)  # one count per row of the tables grouped by counting
    for t in range(first, last):
        e0, n = entry_start[t], entry_start[t + 1] - entry_start[t]
        segments = table_segments[segment_ptr[t] : segment_ptr[t + 1]]
        if table_rows[t] <= COUNTING_SORT_ROWS_PER_LOOKUP * n:
            if counted.shape[0] < table_rows[t]:
                counted = np.empty(table_rows[t], np.int32)
            place = counted[: table_rows[t]]
            place[:] = 0
            distinct[t] = _group_by_counting(values, offsets, bag_start, out_start, out_stride, segments, table_base[t], place, e0, n, rows, bounds, picks)
        else:
            distinct[t] = _group_by_sorting(
                values, offsets, bag_start, out_start, out_stride, segments, table_base[t], table_rows[t], e0, n, rows, bounds, picks
            )


@numba.njit(inline="always")
def _group_by_counting(values, offsets, bag_start, out_start, out_stride, segments, base, place, e0, n, rows, bounds, picks):  # pragma: no cover - compiled
    """``_group`` for one table, whose lookups are in ``segments``, by counting its rows in
    ``place`` (zeros, one per row); returns its distinct rows."""
    for s in segments:
        for k in range(offsets[bag_start[s]], offsets[bag_start[s + 1]]):
            place[values[k]] += 1
    u = e0
    running = 0
    end = e0 + n - 1
    for r in range(place.shape[0]):  # no branch on the count (a third to two thirds of the rows are looked up)
        c = place[r]
        if u <= end:  # true up to the table's last distinct row; a row not looked up is overwritten by the next one
            rows[u] = base + r
            bounds[u] = e0 + running
        u += c != 0
        place[r] = running
        running += c
    for s in segments:
        for bag in range(bag_start[s], bag_start[s + 1]):
            o = out_start[s] + (bag - bag_start[s]) * out_stride[s]
            for k in range(offsets[bag], offsets[bag + 1]):
                v = values[k]
                picks[e0 + place[v]] = o
                place[v] += 1
    return u - e0


@numba.njit(inline="always")
def _group_by_sorting(values, offsets, bag_start, out_start, out_stride, segments, base, num_rows, e0, n, rows, bounds, picks):  # pragma: no cover - compiled
    """``_group`` for one table, whose lookups are in ``segments``, by a radix sort of its
    lookups; returns its distinct rows."""
    keys = np.empty(n, np.int64)
    source = np.empty(n, np.int64)
    i = 0
    for s in segments:
        for bag in range(bag_start[s], bag_start[s + 1]):
            o = out_start[s] + (bag - bag_start[s]) * out_stride[s]
            for k in range(offsets[bag], offsets[bag + 1]):
                keys[i] = values[k]
                source[i] = o
                i += 1
    keys, source = _radix_sort(keys, source, num_rows)
    u = e0
    for i in range(n):
        if i == 0 or keys[i] != keys[i - 1]:
            rows[u] = base + keys[i]
            bounds[u] = e0 + i
            u += 1
        picks[e0 + i] = source[i]
    return u - e0


@numba.njit(inline="always")
def _radix_sort(keys, source, num_rows):  # pragma: no cover - compiled
    """``keys`` in [0, num_rows) sorted (least significant digit first, so stable) with ``source`` alongside."""
    n = keys.shape[0]
    buckets = 1 << DIGIT_BITS
    count = np.empty(buckets, np.int64)
    keys_out = np.empty(n, np.int64)
    source_out = np.empty(n, np.int64)
    shift = 0
    while n > 1 and (num_rows - 1) >> shift > 0:
        count[:] = 0
        for i in range(n):
            count[(keys[i] >> shift) & (buckets - 1)] += 1
        if count[(keys[0] >> shift) & (buckets - 1)] != n:  # not all in one bucket
            running = 0
            for b in range(buckets):
                c = count[b]
                count[b] = running
                running += c
            for i in range(n):
                b = (keys[i] >> shift) & (buckets - 1)
                keys_out[count[b]] = keys[i]
                source_out[count[b]] = source[i]
                count[b] += 1
            keys, keys_out = keys_out, keys
            source, source_out = source_out, source
        shift += DIGIT_BITS
    return keys, source


def _balanced_split(costs: torch.Tensor, threads: int | None) -> list[int]:
    """Boundaries cutting items with ``costs`` int64 [n] (lookups) into contiguous runs of about
    equal cost, one per thread, none under ``MIN_ROWS_PER_THREAD`` lookups unless there is one run."""
    ends = torch.cumsum(costs, 0)
    total = int(ends[-1]) if costs.numel() else 0
    parts = max(1, min(threads or torch.get_num_threads(), costs.numel(), total // row_kernels.MIN_ROWS_PER_THREAD))
    cuts = torch.searchsorted(ends, torch.tensor([total * i // parts for i in range(1, parts)]), right=True).tolist()
    return [0, *cuts, costs.numel()]


def pool(weight: torch.Tensor, segments: Segments, threads: int | None = None) -> torch.Tensor:
    """Each bag's sum of its table's rows of ``weight`` float32 [rows, D], at its output row:
    [num_out, D] (rows no bag writes are zero). Raises ``IndexOutsideTable``."""
    s = segments
    every_row_written = int(s.bag_start[-1] - s.bag_start[0]) == s.num_out if s.bag_start.numel() > 1 else s.num_out == 0
    out = (weight.new_empty if every_row_written else weight.new_zeros)(s.num_out, weight.shape[1])
    arrays = numpy_views(weight.detach(), s.values, s.offsets, s.bag_start, s.table, s.out_start, s.out_stride, s.table_base, s.table_rows, out)
    cost = s.offsets[s.bag_start[1:]] - s.offsets[s.bag_start[:-1]]
    bounds = _balanced_split(cost, threads)
    bad = [-1] * (len(bounds) - 1)
    kernel = _pool_kernel(weight.shape[1])

    def work(part: int, _: int) -> None:
        bad[part] = kernel(*arrays, bounds[part], bounds[part + 1])

    split_over_threads(len(bounds) - 1, work, threads, min_per_thread=1)
    if max(bad) >= 0:
        raise IndexOutsideTable(max(bad))
    return out


def group(segments: Segments, threads: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The lookups grouped by row of the weight, as ``distrec.models.embedding.group_by_row``
    gives them for the bags' rows, with the output row of each lookup's bag in place of the lookup.

    Returns:
        The distinct rows int64 [U], increasing; int64 [U + 1] bounds of each row's range of
        the third result; int64 [nnz] the output rows of the lookups, row by row (each row's
        lookups in their order in ``values``).
    """
    s = segments
    num_tables = s.table_base.numel()
    order = torch.argsort(s.table, stable=True)
    segment_ptr = torch.zeros(num_tables + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(s.table, minlength=num_tables), 0, out=segment_ptr[1:])
    nnz_of_segment = s.offsets[s.bag_start[1:]] - s.offsets[s.bag_start[:-1]]
    per_table = torch.zeros(num_tables, dtype=torch.int64).index_add_(0, s.table, nnz_of_segment)
    entry_start = torch.zeros(num_tables + 1, dtype=torch.int64)
    torch.cumsum(per_table, 0, out=entry_start[1:])
    nnz = int(entry_start[-1])
    rows, bounds, picks = (torch.empty(nnz, dtype=torch.int64) for _ in range(3))
    distinct = torch.zeros(num_tables, dtype=torch.int64)
    arrays = numpy_views(
        s.values, s.offsets, s.bag_start, s.out_start, s.out_stride, order, segment_ptr, s.table_base, s.table_rows, entry_start, rows, bounds, picks, distinct
    )
    cuts = _balanced_split(per_table, threads)
    split_over_threads(len(cuts) - 1, lambda part, _: _group(*arrays, cuts[part], cuts[part + 1]), threads, min_per_thread=1)
    keep = [slice(int(a), int(a) + int(u)) for a, u in zip(entry_start[:-1].tolist(), distinct.tolist())]
    rows = torch.cat([rows[k] for k in keep])
    bounds = torch.cat([*(bounds[k] for k in keep), torch.tensor([nnz])])
    return rows, bounds, picks
