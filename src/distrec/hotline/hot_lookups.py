"""A mini-batch's lookups against a hot set: which are hot and where, which samples are popular,
which hot rows are touched.

Distributed Hotline needs all four before each step: the hot positions for the replicated hot
table, the popular samples to split the mini-batch, and the touched hot rows, whose union over
the ranks is all that the hot table's gradient all-reduce carries. On CPU one compiled pass
(``distrec.kernels.hot_lookups``) finds them; elsewhere torch operators do.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from distrec.data.batch import Batch
from distrec.hotline.hot_set import is_popular
from distrec.hotline.rows import RowSpace, find_sorted
from distrec.kernels import compiled


class HotLookups(NamedTuple):
    """A mini-batch's lookups against the hot rows ``hot_ids`` (ascending global ids, H of them).

    Attributes:
        hot: bool [nnz], whether each index of ``batch.sparse_values`` is a hot row.
        positions: int64 [nnz], each hot index's row in the hot table (meaningless where cold).
        popular: bool [B], whether every index of each sample is hot.
        touched: uint8 [ceil(H / 8)], one bit per hot row the batch looks up (bit ``p % 8`` of
            byte ``p // 8``).
    """

    hot: torch.Tensor
    positions: torch.Tensor
    popular: torch.Tensor
    touched: torch.Tensor


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
    if batch.batch_size and batch.sparse_values.device.type == "cpu":
        space.check_features(batch)
        kernels = compiled("hot_lookups")
        table_base = torch.as_tensor(space.offsets)
        try:
            positions, popular, touched = kernels.find_hot(batch.sparse_values, batch.sparse_offsets, batch.batch_size, table_base, hot_ids)
        except kernels.IndexOutsideTable:
            space.batch_ids(batch)  # raises the error naming the problem
            raise
        return HotLookups(positions >= 0, positions, popular, touched)
    hot, positions = find_sorted(hot_ids, space.batch_ids(batch))
    return HotLookups(hot, positions, is_popular(batch, hot), touched_bits(positions[hot], hot_ids.numel()))
