"""Plans that need no cost model: one sharding type for every table, and the greedy default."""

from __future__ import annotations

import math

from distrec.errors import DistrecError
from distrec.parallel.placement import greedy_place
from distrec.parallel.plan import SHARDING_TYPES, Shard, ShardingPlan, TablePlacement
from distrec.tables import TableConfig


def _even_cuts(total: int, parts: int, multiple: int = 1) -> list[int]:
    """Boundaries splitting ``total`` into ``parts`` near-equal ranges (multiples of ``multiple`` where possible)."""
    units = total // multiple if total % multiple == 0 and total // multiple >= parts else total
    step = multiple if units != total else 1
    return [round(units * i / parts) * step for i in range(parts + 1)]


def uniform_plan(tables: list[TableConfig], world_size: int, sharding: str) -> ShardingPlan:
    """Every table sharded the same way: table_wise (round-robin by size), column_wise or
    row_wise (split over all ranks), or data_parallel (replicated)."""
    if sharding not in SHARDING_TYPES:
        raise DistrecError(f"unknown sharding {sharding!r}; choose one of {', '.join(SHARDING_TYPES)}")
    if sharding == "table_wise":
        return greedy_plan(tables, world_size)
    placements = []
    for t in tables:
        if sharding == "data_parallel":
            shards = [Shard(r, 0, t.num_rows, 0, t.dim) for r in range(world_size)]
        elif sharding == "column_wise":
            parts = min(world_size, t.dim)
            cuts = _even_cuts(t.dim, parts, multiple=4)
            shards = [Shard(r, 0, t.num_rows, a, b) for r, (a, b) in enumerate(zip(cuts, cuts[1:]))]
        else:
            parts = min(world_size, t.num_rows)
            cuts = _even_cuts(t.num_rows, parts)
            shards = [Shard(r, a, b, 0, t.dim) for r, (a, b) in enumerate(zip(cuts, cuts[1:]))]
        placements.append(TablePlacement(t.name, sharding, shards))
    return ShardingPlan(world_size, placements)


def greedy_plan(tables: list[TableConfig], world_size: int, memory_per_rank: int | None = None) -> ShardingPlan:
    """Size-greedy table-wise placement (``planner.placement.greedy_place``, largest table first,
    each on the rank with the fewest bytes), the NeuroShard paper's size-greedy baseline.

    While the tables do not fit table-wise under ``memory_per_rank`` (bytes), the largest
    table-wise table is split row-wise over all ranks instead. Raises DistrecError when the
    tables cannot fit at all.
    """
    if world_size < 1:
        raise DistrecError(f"world size {world_size} must be at least 1")
    memory = math.inf if memory_per_rank is None else memory_per_rank
    order = sorted(range(len(tables)), key=lambda i: (-tables[i].num_bytes, tables[i].name))
    row_wise: list[int] = []
    while True:
        split = {i: _row_wise_shards(tables[i], world_size) for i in row_wise}
        used = [sum(s.num_bytes for shards in split.values() for s in shards if s.rank == r) for r in range(world_size)]
        whole = [i for i in order if i not in split]
        placed = _size_greedy(tables, whole, world_size, memory - max(used))
        if placed is not None:
            break
        if not whole or max(used) > memory:
            need = sum(t.num_bytes for t in tables)
            raise DistrecError(
                f"the tables need {need / 2**20:.1f} MiB but {world_size} ranks x {memory / 2**20:.1f} MiB "
                "cannot hold them; use more ranks, a larger memory limit or a smaller data.max_ind_range"
            )
        row_wise.append(whole[0])
    placements = [
        TablePlacement(t.name, "row_wise", split[i]) if i in split else TablePlacement(t.name, "table_wise", [Shard(placed[i], 0, t.num_rows, 0, t.dim)])
        for i, t in enumerate(tables)
    ]
    return ShardingPlan(world_size, placements)


def _row_wise_shards(table: TableConfig, world_size: int) -> list[Shard]:
    cuts = _even_cuts(table.num_rows, world_size)
    return [Shard(r, a, b, 0, table.dim) for r, (a, b) in enumerate(zip(cuts, cuts[1:])) if b > a]


def _size_greedy(tables: list[TableConfig], order: list[int], world_size: int, memory: float) -> dict[int, int] | None:
    """Rank of each table in ``order`` placed size-greedily within ``memory`` bytes per rank, or None."""
    sizes = [tables[i].num_bytes for i in order]
    load = [0.0] * world_size

    def add_item(rank: int, item: int) -> float:
        load[rank] += sizes[item]
        return load[rank]

    placed = greedy_place(range(len(order)), sizes, [tables[i].dim for i in order], world_size, memory, add_item)
    return None if placed is None else {table: rank for table, rank in zip(order, placed[0])}
