"""Global row ids: every row of every table numbered once, table after table.

Hotline counts, selects, stores and updates rows of all tables together, so it names a
row ``(table t, row r)`` by one int64, ``offsets[t] + r``. Sorting global ids sorts by
table, then row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.tables import TableConfig


@dataclass(frozen=True)
class RowSpace:
    """The global row numbering of an ordered list of tables (table t = sparse feature t).

    Attributes:
        names: table names in feature order.
        offsets: int64 [T + 1]; table t owns global ids ``offsets[t] .. offsets[t + 1] - 1``.

    Example:
        >>> space = RowSpace.from_tables([TableConfig("a", 3, 4), TableConfig("b", 5, 4)])
        >>> space.to_table_rows(np.array([1, 3, 7]))
        (array([0, 1, 1]), array([1, 0, 4]))
    """

    names: tuple[str, ...]
    offsets: np.ndarray

    @classmethod
    def from_tables(cls, tables: list[TableConfig]) -> RowSpace:
        offsets = np.zeros(len(tables) + 1, dtype=np.int64)
        np.cumsum([t.num_rows for t in tables], out=offsets[1:])
        return cls(tuple(t.name for t in tables), offsets)

    @property
    def num_tables(self) -> int:
        return len(self.names)

    @property
    def table_sizes(self) -> tuple[int, ...]:
        """Rows of each table, in feature order."""
        return tuple(np.diff(self.offsets).tolist())

    @property
    def total_rows(self) -> int:
        return int(self.offsets[-1])

    def batch_ids(self, batch: Batch) -> torch.Tensor:
        """Global id of every index of ``batch``: int64 [nnz], on the batch's device."""
        values, offsets = batch.sparse_values, batch.sparse_offsets
        if batch.batch_size == 0:
            return values.new_empty(0)
        self.check_features(batch)
        per_feature = torch.diff(offsets[:: batch.batch_size])  # indices of each feature [F]
        bounds = torch.as_tensor(self.offsets, device=values.device)
        table_of = torch.repeat_interleave(torch.arange(self.num_tables, device=values.device), per_feature, output_size=values.numel())
        ids = values + bounds[table_of]
        if batch.checked_within(self.table_sizes):
            return ids  # checked by the loader, on the host
        if bool(torch.any(values < 0) | torch.any(ids >= bounds[table_of + 1])):
            raise DistrecError("the batch has row indices outside their tables; prepare the data with these table sizes")
        return ids

    def check_features(self, batch: Batch) -> None:
        """Raise DistrecError unless ``batch`` has one sparse feature per table."""
        if batch.num_features != self.num_tables:
            raise DistrecError(
                f"the batch has {batch.num_features} sparse features but the model has {self.num_tables} tables; use data prepared for this model"
            )

    def to_table_rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Split global ids into (table index, row within the table), both int64 like ``ids``."""
        ids = np.asarray(ids, dtype=np.int64)
        table = np.searchsorted(self.offsets, ids, side="right") - 1
        return table, ids - self.offsets[table]

    def to_global(self, table: int, rows: np.ndarray) -> np.ndarray:
        """Global ids of ``rows`` of table index ``table``."""
        return np.asarray(rows, dtype=np.int64) + self.offsets[table]


def find_sorted(sorted_ids: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where ``ids`` sit in the ascending unique ``sorted_ids``.

    Returns (found: bool [n], pos: int64 [n]); ``pos`` is the index of the match where
    ``found``, and meaningless elsewhere. Runs on the tensors' device.
    """
    if sorted_ids.numel() == 0:
        return torch.zeros_like(ids, dtype=torch.bool), torch.zeros_like(ids)
    pos = torch.searchsorted(sorted_ids, ids).clamp_(max=sorted_ids.numel() - 1)
    return sorted_ids[pos] == ids, pos
