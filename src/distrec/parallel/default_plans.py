"""Plans that need no cost model: one sharding type for every table, and the greedy default."""

from __future__ import annotations

from distrec.errors import DistrecError
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
    """Table-wise placement balancing rows x dim per rank, largest table first.

    A table that fits on no rank under ``memory_per_rank`` (bytes) is split row-wise over all
    ranks. Raises DistrecError when the tables cannot fit at all.
    """
    if world_size < 1:
        raise DistrecError(f"world size {world_size} must be at least 1")
    load = [0] * world_size
    placements: dict[str, TablePlacement] = {}
    for t in sorted(tables, key=lambda t: (-t.num_bytes, t.name)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        if memory_per_rank is None or load[rank] + t.num_bytes <= memory_per_rank:
            placements[t.name] = TablePlacement(t.name, "table_wise", [Shard(rank, 0, t.num_rows, 0, t.dim)])
            load[rank] += t.num_bytes
            continue
        cuts = _even_cuts(t.num_rows, world_size)
        shards = [Shard(r, a, b, 0, t.dim) for r, (a, b) in enumerate(zip(cuts, cuts[1:])) if b > a]
        for s in shards:
            load[s.rank] += s.num_bytes
        if any(used > memory_per_rank for used in load):
            need = sum(x.num_bytes for x in tables)
            raise DistrecError(
                f"the tables need {need / 2**20:.1f} MiB but {world_size} ranks x {memory_per_rank / 2**20:.1f} MiB "
                "cannot hold them; use more ranks, a larger memory limit or a smaller data.max_ind_range"
            )
        placements[t.name] = TablePlacement(t.name, "row_wise", shards)
    return ShardingPlan(world_size, [placements[t.name] for t in tables])
