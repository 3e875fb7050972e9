"""The hot set: the most accessed rows that fit a byte budget, and the popular-input split.

An input (sample) is *popular* when every index it touches, in every feature, is a hot
row (Hotline, Adnan et al., ISCA 2024): a popular micro-batch needs nothing from the slow
tier.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.hotline.rows import RowSpace
from distrec.hotline.tiers import FLOAT_BYTES
from distrec.io import atomic_write_text, read_json
from distrec.tables import TableConfig

INDEX_BYTES_PER_ROW = 8  # the row's int64 global id in the fast tier's sorted id array


def hot_row_bytes(dim: int, state_floats: int = 0, weight_bytes: int = FLOAT_BYTES) -> int:
    """Fast-tier bytes of one hot row: its weights (``weight_bytes`` each: 4, or 2 for a half
    table) and float32 optimizer state, plus its int64 id."""
    return dim * weight_bytes + state_floats * FLOAT_BYTES + INDEX_BYTES_PER_ROW


@dataclass
class HotSet:
    """The rows kept in the fast tier.

    Attributes:
        budget_bytes: the fast-tier budget the set was selected for, in bytes.
        rows: table name -> ascending unique int64 hot rows of that table, for every
            table of the model in feature order (empty arrays for tables with none).
    """

    budget_bytes: int
    rows: dict[str, np.ndarray]

    @property
    def num_rows(self) -> int:
        """Hot rows over all tables."""
        return sum(int(r.size) for r in self.rows.values())

    @classmethod
    def from_global_ids(cls, ids: np.ndarray, space: RowSpace, budget_bytes: int) -> HotSet:
        """The hot set of the global ``ids`` (any order, no duplicates)."""
        ids = np.sort(np.asarray(ids, dtype=np.int64))
        bounds = np.searchsorted(ids, space.offsets)
        return cls(
            budget_bytes,
            {name: ids[bounds[t] : bounds[t + 1]] - space.offsets[t] for t, name in enumerate(space.names)},
        )

    def global_ids(self, space: RowSpace) -> np.ndarray:
        """Ascending int64 global ids of the hot rows."""
        self.check(space)
        return np.concatenate([space.to_global(t, self.rows[name]) for t, name in enumerate(space.names)])

    def check(self, space: RowSpace) -> None:
        """Raise DistrecError unless this set names exactly these tables with rows inside them."""
        if tuple(self.rows) != space.names:
            raise DistrecError(f"hot set tables {list(self.rows)} do not match the model's {list(space.names)}; relearn the hot set for this model")
        for t, (name, rows) in enumerate(self.rows.items()):
            size = int(space.offsets[t + 1] - space.offsets[t])
            if rows.size and (rows[0] < 0 or rows[-1] >= size or np.any(np.diff(rows) <= 0)):
                raise DistrecError(f"hot set rows of table {name!r} are not ascending unique rows below {size}; relearn the hot set")

    def to_dict(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "tables": {name: rows.tolist() for name, rows in self.rows.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> HotSet:
        try:
            budget = d["budget_bytes"]
            tables = d["tables"]
            if not isinstance(budget, int) or budget < 0 or not isinstance(tables, dict):
                raise TypeError("budget_bytes must be an int >= 0 and tables a mapping")
            rows = {str(name): np.asarray(r, dtype=np.int64).reshape(-1) for name, r in tables.items()}
        except (KeyError, TypeError, ValueError) as e:
            raise DistrecError(f"hot set is malformed ({type(e).__name__}: {e}); relearn it") from None
        return cls(budget, rows)

    def save(self, path: str | Path) -> None:
        """Write as compact JSON, atomically."""
        atomic_write_text(path, json.dumps(self.to_dict(), separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: str | Path, tables: list[TableConfig] | None = None) -> HotSet:
        """Read a saved hot set, checked against ``tables`` when given."""
        hot = cls.from_dict(read_json(path, "hot set", "check the path or relearn it", "relearn it"))
        if tables is not None:
            hot.check(RowSpace.from_tables(tables))
        return hot


def select_hot_set(ids: np.ndarray, counts: np.ndarray, space: RowSpace, row_bytes: int | Sequence[int], budget_bytes: int) -> HotSet:
    """The most accessed rows, over all tables, whose fast-tier bytes fit ``budget_bytes``.

    Rows are ranked by count (ties: smaller global id first) and the longest prefix of the
    ranking that fits the budget is hot. Rows never counted are never hot.

    Args:
        ids: global row ids, unique, with their access ``counts`` (e.g. ``AccessLogger.counts()``).
        space: the tables' global row numbering.
        row_bytes: fast-tier bytes of one row, one value or one per table (``hot_row_bytes``).
        budget_bytes: the fast-tier budget in bytes.
    """
    ids = np.asarray(ids, dtype=np.int64)
    counts = np.asarray(counts)
    keep = counts > 0
    ids, counts = ids[keep], counts[keep]
    ranked = ids[np.lexsort((ids, -counts.astype(np.int64)))]
    per_table = np.broadcast_to(np.asarray(row_bytes, dtype=np.int64), (space.num_tables,))
    table, _ = space.to_table_rows(ranked)
    fits = int(np.searchsorted(np.cumsum(per_table[table]), budget_bytes, side="right"))
    return HotSet.from_global_ids(ranked[:fits], space, budget_bytes)


def is_popular(batch: Batch, hot: torch.Tensor) -> torch.Tensor:
    """Bool [B]: whether every index of each sample is hot.

    Args:
        batch: the mini-batch (jagged, feature-major).
        hot: bool [nnz], whether each index of ``batch.sparse_values`` is a hot row.
    """
    popular = torch.ones(batch.batch_size, dtype=torch.bool, device=hot.device)
    popular[sample_of_lookups(batch)[~hot]] = False
    return popular


def sample_of_lookups(batch: Batch) -> torch.Tensor:
    """int64 [nnz]: the sample (0..B-1) of every index of ``batch.sparse_values``."""
    offsets = batch.sparse_offsets
    if batch.batch_size == 0:
        return offsets.new_empty(0)
    bag_lengths = torch.diff(offsets)
    sample_of = torch.arange(bag_lengths.numel(), device=offsets.device).remainder_(batch.batch_size)
    return torch.repeat_interleave(sample_of, bag_lengths, output_size=batch.sparse_values.numel())


def split_batch(batch: Batch, popular: torch.Tensor) -> tuple[Batch, torch.Tensor, Batch, torch.Tensor]:
    """(popular samples, the position in ``batch.sparse_values`` of each of their indices, the
    other samples, the positions of theirs) of ``batch``, each keeping the original order;
    ``popular``: bool [B]."""
    hot_batch, hot_positions = batch.select_with_positions(torch.nonzero(popular).view(-1))
    other_batch, other_positions = batch.select_with_positions(torch.nonzero(~popular).view(-1))
    return hot_batch, hot_positions, other_batch, other_positions
