"""ShardingPlan: which rank holds which table, column range or row range."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from distrec.errors import DistrecError
from distrec.io import atomic_write_json, read_json
from distrec.tables import TableConfig

SHARDING_TYPES = ("table_wise", "column_wise", "row_wise", "data_parallel")


@dataclass(frozen=True)
class Shard:
    """A block of one table on one rank: rows [row_start, row_end) x columns [col_start, col_end)."""

    rank: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int

    @property
    def num_bytes(self) -> int:
        """float32 weight bytes of this block."""
        return (self.row_end - self.row_start) * (self.col_end - self.col_start) * 4


@dataclass
class TablePlacement:
    """How one table is placed: its sharding type and its shards.

    table_wise: one shard covering the whole table. column_wise: shards covering all rows
    and disjoint column ranges. row_wise: shards covering all columns and disjoint row
    ranges. data_parallel: one full shard per rank (a replica on every rank).
    """

    table: str
    sharding: str
    shards: list[Shard]


@dataclass
class ShardingPlan:
    """The placement of every table for a world of ``world_size`` ranks."""

    world_size: int
    tables: list[TablePlacement] = field(default_factory=list)

    def placement(self, table: str) -> TablePlacement:
        for p in self.tables:
            if p.table == table:
                return p
        raise KeyError(table)

    def bytes_per_rank(self) -> list[int]:
        """float32 weight bytes each rank holds."""
        out = [0] * self.world_size
        for p in self.tables:
            for s in p.shards:
                out[s.rank] += s.num_bytes
        return out

    def to_dict(self) -> dict:
        return {
            "world_size": self.world_size,
            "tables": [{"table": p.table, "sharding": p.sharding, "shards": [vars(s) for s in p.shards]} for p in self.tables],
        }

    @classmethod
    def from_dict(cls, d: dict) -> ShardingPlan:
        try:
            return cls(
                world_size=int(d["world_size"]),
                tables=[TablePlacement(t["table"], t["sharding"], [Shard(**_integers(s)) for s in t["shards"]]) for t in d["tables"]],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DistrecError(f"sharding plan is malformed ({type(e).__name__}: {e}); regenerate it with 'distrec plan'") from None

    def save(self, path: str | Path) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> ShardingPlan:
        """A plan saved by ``save``, or a TorchRec plan in the JSON form of ``distrec.parallel.torchrec_format``."""
        from distrec.parallel.torchrec_format import distrec_plan_dict, is_torchrec_plan

        document = read_json(path, "sharding plan", "check the --plan path", "regenerate it with 'distrec plan'")
        return cls.from_dict(distrec_plan_dict(document) if is_torchrec_plan(document) else document)

    def validate(self, tables: list[TableConfig], memory_per_rank: int | None = None) -> None:
        """Check the plan covers exactly these tables on ranks < world_size (bytes limit optional)."""
        by_name = {t.name: t for t in tables}
        planned = [p.table for p in self.tables]
        missing = sorted(set(by_name) - set(planned))
        extra = sorted(set(planned) - set(by_name))
        twice = sorted({name for name in planned if planned.count(name) > 1})
        if twice:
            raise DistrecError(
                f"sharding plan lists table(s) {', '.join(twice)} more than once; keep one entry per table, or regenerate it with 'distrec plan'"
            )
        if missing or extra:
            raise DistrecError(
                f"sharding plan does not match the model's tables (missing: {missing or 'none'}, "
                f"unknown: {extra or 'none'}); regenerate it for this data with 'distrec plan'"
            )
        if self.world_size < 1:
            raise DistrecError(f"sharding plan has world_size {self.world_size}; it must be at least 1")
        for p in self.tables:
            _validate_placement(p, by_name[p.table], self.world_size)
        if memory_per_rank is not None:
            for rank, used in enumerate(self.bytes_per_rank()):
                if used > memory_per_rank:
                    raise DistrecError(
                        f"sharding plan puts {used / 2**20:.1f} MiB of tables on rank {rank}, over the "
                        f"{memory_per_rank / 2**20:.1f} MiB limit; use more ranks, a larger limit or a row-wise plan"
                    )


def _integers(shard: dict) -> dict:
    """A shard's fields, which must all be JSON integers (TypeError naming the first that is not)."""
    for key, value in shard.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"shard {key} is {value!r}, not an integer")
    return shard


def _validate_placement(p: TablePlacement, t: TableConfig, world_size: int) -> None:
    def bad(why: str) -> DistrecError:
        return DistrecError(f"sharding plan for table {t.name!r} ({p.sharding}) is invalid: {why}; fix or regenerate the plan")

    if p.sharding not in SHARDING_TYPES:
        raise bad(f"unknown sharding type, choose one of {', '.join(SHARDING_TYPES)}")
    if not p.shards:
        raise bad("it has no shards")
    for s in p.shards:
        if not 0 <= s.rank < world_size:
            raise bad(f"rank {s.rank} is outside 0..{world_size - 1}")
        if not (0 <= s.row_start < s.row_end <= t.num_rows and 0 <= s.col_start < s.col_end <= t.dim):
            raise bad(f"shard rows {s.row_start}:{s.row_end} cols {s.col_start}:{s.col_end} fall outside {t.num_rows}x{t.dim}")
    full = all(s.row_start == 0 and s.row_end == t.num_rows and s.col_start == 0 and s.col_end == t.dim for s in p.shards)
    if p.sharding == "table_wise" and not (len(p.shards) == 1 and full):
        raise bad("table-wise needs exactly one shard covering the whole table")
    if p.sharding == "data_parallel" and not (full and sorted(s.rank for s in p.shards) == list(range(world_size))):
        raise bad("data-parallel needs one full shard on every rank")
    if p.sharding == "column_wise":
        if any(s.row_start != 0 or s.row_end != t.num_rows for s in p.shards):
            raise bad("column-wise shards must cover all rows")
        _check_tiling([(s.col_start, s.col_end) for s in p.shards], t.dim, "columns", bad)
    if p.sharding == "row_wise":
        if any(s.col_start != 0 or s.col_end != t.dim for s in p.shards):
            raise bad("row-wise shards must cover all columns")
        _check_tiling([(s.row_start, s.row_end) for s in p.shards], t.num_rows, "rows", bad)


def _check_tiling(ranges: list[tuple[int, int]], total: int, what: str, bad) -> None:
    pos = 0
    for start, end in sorted(ranges):
        if start != pos:
            raise bad(f"its {what} ranges leave a gap or overlap at {pos}")
        pos = end
    if pos != total:
        raise bad(f"its {what} ranges end at {pos}, not {total}")
