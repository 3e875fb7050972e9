"""The planner's vocabulary: tables with access statistics, user constraints, column chunks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from distrec.errors import DistrecError
from distrec.tables import TableConfig

NUM_HISTOGRAM_BINS = 17
"""Reuse-factor bins (0,1], (1,2], (2,4], ..., (16384,32768], >32768, as in the published
DLRM locality statistics (facebookresearch/dlrm_datasets, locality_stats_*.txt)."""

MIN_SHARD_DIM = 4
"""Column shards keep dimensions divisible by 4 (NeuroShard, Sec. 4; aligned vector loads)."""

BYTES_PER_FLOAT = 4


def check_seed(seed: int) -> None:
    """DistrecError for a seed NumPy's generators refuse (a negative one)."""
    if seed < 0:
        raise DistrecError(f"--seed {seed} is negative; give a seed of 0 or more")


@dataclass(frozen=True)
class TableSpec:
    """One embedding table as the planner sees it: its shape and how it is accessed.

    Attributes:
        name: table (and feature) name.
        num_rows: rows (hash size).
        dim: embedding dimension (floats per row).
        pooling_factor: mean number of indices per sample (bag length).
        histogram: 17 fractions of the distinct rows of a batch falling in each reuse-factor
            bin (see ``distrec.planner.features.reuse_histogram``); sums to 1.
    """

    name: str
    num_rows: int
    dim: int
    pooling_factor: float
    histogram: tuple[float, ...]

    def __post_init__(self) -> None:
        TableConfig(self.name, self.num_rows, self.dim)  # shape checks with the shared messages
        if not (self.pooling_factor >= 0 and math.isfinite(self.pooling_factor)):
            raise DistrecError(f"table {self.name!r} has pooling factor {self.pooling_factor}; it must be a number >= 0")
        if len(self.histogram) != NUM_HISTOGRAM_BINS:
            raise DistrecError(f"table {self.name!r} has a histogram of {len(self.histogram)} bins; it needs {NUM_HISTOGRAM_BINS}")
        h = np.asarray(self.histogram, dtype=np.float64)
        if not np.all(np.isfinite(h)) or np.any(h < 0) or h.sum() <= 0:
            raise DistrecError(f"table {self.name!r} has a histogram with negative or no mass; give 17 fractions >= 0")
        object.__setattr__(self, "histogram", tuple(float(x) for x in h / h.sum()))

    @property
    def num_bytes(self) -> int:
        """float32 weight bytes of the whole table."""
        return self.num_rows * self.dim * BYTES_PER_FLOAT

    def with_dim(self, dim: int) -> TableSpec:
        """The same table with another dimension (a column shard, or a task's chosen dim)."""
        return TableSpec(self.name, self.num_rows, dim, self.pooling_factor, self.histogram)

    def to_config(self) -> TableConfig:
        """The shared TableConfig (what ShardingPlan.validate and the models take)."""
        return TableConfig(self.name, self.num_rows, self.dim, multi_hot=self.pooling_factor > 1)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "rows": self.num_rows,
            "dim": self.dim,
            "pooling_factor": self.pooling_factor,
            "histogram": list(self.histogram),
        }

    @classmethod
    def from_dict(cls, d: object, where: str, default_histogram: tuple[float, ...] | None = None) -> TableSpec:
        """Parse ``{name, rows, dim, pooling_factor, histogram?}``; ``where`` names the entry in errors."""
        if not isinstance(d, dict):
            raise DistrecError(f"{where} must be a mapping with name, rows, dim, pooling_factor; got {d!r}")
        missing = [k for k in ("name", "rows", "dim", "pooling_factor") if k not in d]
        unknown = sorted(set(d) - {"name", "rows", "dim", "pooling_factor", "histogram"})
        if missing or unknown:
            raise DistrecError(
                f"{where} has missing keys {missing or 'none'} and unknown keys {unknown or 'none'}; "
                "give name, rows, dim, pooling_factor and optionally histogram"
            )
        histogram = d.get("histogram", default_histogram)
        if histogram is None:
            raise DistrecError(f"{where} has no histogram; give 17 reuse-factor fractions")
        try:
            rows, dim, pooling = int(d["rows"]), int(d["dim"]), float(d["pooling_factor"])
            hist = tuple(float(x) for x in histogram)
        except (TypeError, ValueError):
            raise DistrecError(f"{where}: rows and dim must be integers, pooling_factor a number, histogram a list of numbers") from None
        if rows != d["rows"] or dim != d["dim"]:
            raise DistrecError(f"{where}: rows and dim must be whole numbers, got {d['rows']!r} and {d['dim']!r}")
        return cls(str(d["name"]), rows, dim, pooling, hist)


@dataclass(frozen=True)
class PlanConstraints:
    """What the user fixes: tables pinned to a rank, and tables that must not be column-split."""

    pins: dict[str, int] = field(default_factory=dict)
    no_split: frozenset[str] = frozenset()

    def check(self, tables: list[TableSpec], num_devices: int) -> None:
        """Raise DistrecError if a constraint names an unknown table or rank."""
        names = {t.name for t in tables}
        for name in sorted(set(self.pins) | set(self.no_split)):
            if name not in names:
                raise DistrecError(f"constraint names table {name!r}, which is not in the table list; fix the name")
        for name, rank in self.pins.items():
            if not 0 <= rank < num_devices:
                raise DistrecError(f"table {name!r} is pinned to rank {rank}, outside 0..{num_devices - 1}; pin it to a valid rank")


@dataclass(frozen=True)
class Chunk:
    """A column range [col_start, col_start + dim) of table ``table`` (an index into the task)."""

    table: int
    col_start: int
    dim: int

    def halves(self) -> tuple[Chunk, Chunk]:
        half = self.dim // 2
        return Chunk(self.table, self.col_start, half), Chunk(self.table, self.col_start + half, half)


def can_halve(dim: int) -> bool:
    """Whether a column shard of ``dim`` columns splits into two halves divisible by 4."""
    return dim % (2 * MIN_SHARD_DIM) == 0
