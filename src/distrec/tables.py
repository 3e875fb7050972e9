"""Descriptions of embedding tables, shared by the models, the data and the planners."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

from distrec.errors import DistrecError


@dataclass(frozen=True)
class TableConfig:
    """One embedding table, looked up by the sparse feature of the same name.

    Attributes:
        name: feature and table name, unique in a model.
        num_rows: rows in the table (the feature's hash size), >= 1.
        dim: embedding dimension (floats per row), >= 1.
        multi_hot: whether a sample may carry several indices (a bag) for this feature.
    """

    name: str
    num_rows: int
    dim: int
    multi_hot: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise DistrecError("a table has an empty name; give every sparse feature a name")
        if self.num_rows < 1:
            raise DistrecError(f"table {self.name!r} has {self.num_rows} rows; it needs at least 1")
        if self.dim < 1:
            raise DistrecError(f"table {self.name!r} has dimension {self.dim}; it needs at least 1")

    @property
    def num_bytes(self) -> int:
        """Size of the float32 weights in bytes."""
        return self.num_rows * self.dim * 4

    def index_error(self, index: int) -> DistrecError:
        """The error for a lookup of ``index``, outside this table's rows."""
        return DistrecError(
            f"sparse feature {self.name!r} has index {index} but its table has {self.num_rows} rows; hash indices into [0, {self.num_rows}) or enlarge the table"
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TableConfig:
        return cls(**d)


def stand_in_tables(tables: list[TableConfig]) -> list[TableConfig]:
    """One-row copies of ``tables``: build a model with them (its dense layers do not depend
    on table sizes) when the real tables are made elsewhere (Hotline's tiers, a rank's
    shards), so no table-sized tensor is allocated for them."""
    return [replace(t, num_rows=1) for t in tables]


def exchanged_index_bytes(row_counts: Iterable[int]) -> int:
    """Bytes per bag length or index in the sharded input all-to-all over tables of
    ``row_counts`` rows: 4 (int32) when every table's rows fit, else 8 (int64)."""
    return 4 if max(row_counts) <= 2**31 - 1 else 8
