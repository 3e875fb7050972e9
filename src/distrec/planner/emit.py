"""Turn a placement of column chunks into the ShardingPlan the sharded trainer reads."""

from __future__ import annotations

from distrec.parallel.plan import Shard, ShardingPlan, TablePlacement
from distrec.planner.types import Chunk, TableSpec


def build_plan(tables: list[TableSpec], chunks: list[Chunk], device_of: list[int], num_devices: int) -> ShardingPlan:
    """The ShardingPlan placing ``chunks[i]`` on rank ``device_of[i]``.

    Adjacent column ranges of a table on the same rank are merged; a table left with one
    chunk is table-wise, otherwise column-wise (shards cover all rows and disjoint columns).

    Example:
        >>> t = TableSpec("a", 10, 8, 1.0, (1.0,) + (0.0,) * 16)
        >>> build_plan([t], [Chunk(0, 0, 4), Chunk(0, 4, 4)], [1, 1], 2).tables[0].sharding
        'table_wise'
    """
    by_table: list[list[tuple[int, int, int]]] = [[] for _ in tables]
    for chunk, rank in zip(chunks, device_of):
        by_table[chunk.table].append((chunk.col_start, chunk.col_start + chunk.dim, rank))
    placements = []
    for table, ranges in zip(tables, by_table):
        merged: list[list[int]] = []
        for start, end, rank in sorted(ranges):
            if merged and merged[-1][1] == start and merged[-1][2] == rank:
                merged[-1][1] = end
            else:
                merged.append([start, end, rank])
        shards = [Shard(rank, 0, table.num_rows, start, end) for start, end, rank in merged]
        placements.append(TablePlacement(table.name, "table_wise" if len(shards) == 1 else "column_wise", shards))
    return ShardingPlan(num_devices, placements)


def whole_tables(tables: list[TableSpec]) -> list[Chunk]:
    """One chunk per table covering all its columns."""
    return [Chunk(i, 0, t.dim) for i, t in enumerate(tables)]


def device_tables(plan: ShardingPlan, tables: list[TableSpec]) -> list[list[TableSpec]]:
    """What each rank of a table- or column-wise plan holds, as tables of the shards' widths."""
    by_name = {t.name: t for t in tables}
    out: list[list[TableSpec]] = [[] for _ in range(plan.world_size)]
    for placement in plan.tables:
        table = by_name[placement.table]
        for s in placement.shards:
            out[s.rank].append(table.with_dim(s.col_end - s.col_start))
    return out
