"""A mini-batch's lookups against a hot set: which are hot and where, which samples are popular,
which hot rows and which features' cold rows are touched; and the mini-batch split by them.

Distributed Hotline needs all of it before each step: the hot positions for the replicated hot
table, the popular samples to split the mini-batch, the touched hot rows, whose union over
the ranks is all that the hot table's gradient all-reduce carries, and the features with cold
lookups, the only ones the cold exchange carries. Then the popular micro-batch with its hot
lookups, and the other one with its hot lookups and its cold indices. On CPU two compiled
passes (``distrec.kernels.hot_lookups``) find and split them; elsewhere torch operators do.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from distrec.data.batch import Batch
from distrec.hotline.hot_set import is_popular, split_batch
from distrec.hotline.rows import RowSpace, find_sorted
from distrec.kernels import compiled, runs_compiled


class HotLookups(NamedTuple):
    """A mini-batch's lookups against the hot rows ``hot_ids`` (ascending global ids, H of them).

    Attributes:
        hot: bool [nnz], whether each index of ``batch.sparse_values`` is a hot row.
        positions: int64 [nnz], each hot index's row in the hot table (meaningless where cold).
        popular: bool [B], whether every index of each sample is hot.
        touched: uint8 [ceil(H / 8)], one bit per hot row the batch looks up (bit ``p % 8`` of
            byte ``p // 8``).
        cold_features: uint8 [ceil(F / 8)], one bit per feature with an index not hot.
    """

    hot: torch.Tensor
    positions: torch.Tensor
    popular: torch.Tensor
    touched: torch.Tensor
    cold_features: torch.Tensor


class HotBags(NamedTuple):
    """The hot lookups of a micro-batch's bags, to pool from the hot table.

    Attributes:
        rows: int64 [n], the hot-table row of each hot lookup, bag after bag.
        offsets: int64 [F * B + 1], where each bag's hot lookups start in ``rows``.
        bag_of: int64 [n], the bag of each lookup.
    """

    rows: torch.Tensor
    offsets: torch.Tensor
    bag_of: torch.Tensor


class MicroBatches(NamedTuple):
    """A mini-batch split into its popular samples (every index hot) and the others, each in
    the mini-batch's order: ``popular`` with ``popular_hot``, all its lookups; ``other`` with
    ``other_hot``, its hot lookups, and ``other_cold``, its samples with only their cold indices."""

    popular: Batch
    popular_hot: HotBags
    other: Batch
    other_hot: HotBags
    other_cold: Batch


def kept_bags(offsets: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bags of a jagged batch cut at ``offsets`` int64 [bags + 1] with only the indices
    where ``keep`` (bool [nnz]): their offsets int64 [bags + 1] and the bag of each kept
    index, int64 [kept]."""
    lengths = torch.diff(offsets)
    bag_of = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths, output_size=keep.numel())[keep]
    kept = torch.zeros_like(offsets)
    torch.cumsum(torch.bincount(bag_of, minlength=lengths.numel()), 0, out=kept[1:])
    return kept, bag_of


def keep_indices(batch: Batch, keep: torch.Tensor) -> Batch:
    """The same samples with only the indices where ``keep`` (bool [nnz]) in every bag."""
    offsets, _ = kept_bags(batch.sparse_offsets, keep)
    return Batch(batch.dense, batch.sparse_values[keep], offsets, batch.labels, batch.part_layout(whole_bags=False))


def hot_bags(batch: Batch, hot: torch.Tensor, positions: torch.Tensor) -> HotBags:
    """The hot lookups of ``batch``'s bags; ``hot``: bool [nnz], ``positions``: int64 [nnz], each
    hot index's row in the hot table (``HotLookups``)."""
    offsets, bag_of = kept_bags(batch.sparse_offsets, hot)
    return HotBags(positions[hot], offsets, bag_of)


def touched_bits(positions: torch.Tensor, num_rows: int) -> torch.Tensor:
    """One bit per row of ``num_rows`` set where ``positions`` (int64 [n], repeats allowed) points:
    uint8 [ceil(num_rows / 8)], bit ``p % 8`` of byte ``p // 8``."""
    bits = torch.zeros((num_rows + 7) // 8 * 8, dtype=torch.uint8, device=positions.device)
    bits[positions] = 1
    return (bits.view(-1, 8) << torch.arange(8, dtype=torch.uint8, device=bits.device)).sum(1, dtype=torch.uint8)


def cold_feature_bits(batch: Batch, hot: torch.Tensor, num_features: int) -> torch.Tensor:
    """One bit per feature of ``batch`` (of ``num_features``) set where some index is not hot
    (``hot``: bool [nnz]): uint8 [ceil(num_features / 8)], bit ``f % 8`` of byte ``f // 8``."""
    if batch.batch_size == 0:
        return touched_bits(hot.new_zeros(0, dtype=torch.int64), num_features)
    cold_before = torch.zeros(hot.numel() + 1, dtype=torch.int64, device=hot.device)
    torch.cumsum(~hot, 0, out=cold_before[1:])
    bounds = batch.sparse_offsets[:: batch.batch_size]  # [F + 1]: where each feature's indices start
    return touched_bits(torch.nonzero(cold_before[bounds[1:]] > cold_before[bounds[:-1]]).view(-1), num_features)


def find_hot_lookups(batch: Batch, space: RowSpace, hot_ids: torch.Tensor) -> HotLookups:
    """The hot lookups of ``batch`` (see ``HotLookups``); raises DistrecError when an index lies
    outside its table or the batch has another number of features than ``space`` has tables."""
    if batch.batch_size and runs_compiled(batch.sparse_values):
        space.check_features(batch)
        kernels = compiled("hot_lookups")
        table_base = torch.as_tensor(space.offsets)
        try:
            positions, popular, touched, cold_features = kernels.find_hot(batch.sparse_values, batch.sparse_offsets, batch.batch_size, table_base, hot_ids)
        except kernels.IndexOutsideTable:
            space.batch_ids(batch)  # raises the error naming the problem
            raise
        return HotLookups(positions >= 0, positions, popular, touched, cold_features)
    hot, positions = find_sorted(hot_ids, space.batch_ids(batch))
    cold_features = cold_feature_bits(batch, hot, space.num_tables)
    return HotLookups(hot, positions, is_popular(batch, hot), touched_bits(positions[hot], hot_ids.numel()), cold_features)


def split_lookups(batch: Batch, found: HotLookups) -> MicroBatches:
    """``batch`` split by its hot lookups ``found`` (``find_hot_lookups``) into micro-batches."""
    if batch.batch_size and runs_compiled(batch.sparse_values):
        popular_part, other_part, other_hot, other_cold = compiled("hot_lookups").split_lookups(
            batch.sparse_values, batch.sparse_offsets, batch.batch_size, found.positions, found.popular
        )
        values, rows, bag_of, offsets = popular_part
        popular_at, other_at = torch.nonzero(found.popular).view(-1), torch.nonzero(~found.popular).view(-1)
        popular = Batch(batch.dense[popular_at], values, offsets, batch.labels[popular_at], batch.part_layout(whole_bags=True))
        other = Batch(batch.dense[other_at], *other_part, batch.labels[other_at], batch.part_layout(whole_bags=True))
        rows_other, bag_of_other, offsets_other = other_hot
        return MicroBatches(
            popular,
            HotBags(rows, offsets, bag_of),
            other,
            HotBags(rows_other, offsets_other, bag_of_other),
            Batch(other.dense, *other_cold, other.labels, batch.part_layout(whole_bags=False)),
        )
    return split_with_operators(batch, found)


def split_with_operators(batch: Batch, found: HotLookups) -> MicroBatches:
    """``split_lookups`` in torch operators, on any device."""
    popular, popular_at, other, other_at = split_batch(batch, found.popular)
    hot_other = found.hot[other_at]
    return MicroBatches(
        popular,
        hot_bags(popular, found.hot[popular_at], found.positions[popular_at]),
        other,
        hot_bags(other, hot_other, found.positions[other_at]),
        keep_indices(other, ~hot_other),
    )
