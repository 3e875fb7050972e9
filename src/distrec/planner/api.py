"""The planner's entry point: tables + devices + memory + algorithm -> ShardingPlan and a report."""

from __future__ import annotations

import time

from distrec.errors import DistrecError
from distrec.parallel.plan import ShardingPlan
from distrec.planner.cost_models import CostModels
from distrec.planner.emit import build_plan, device_tables, whole_tables
from distrec.planner.heuristics import HEURISTICS, heuristic_placement
from distrec.planner.search import NeuroShardSearch, SearchOptions, check_feasible
from distrec.planner.torchrec_planner import require_torchrec, torchrec_plan
from distrec.planner.types import PlanConstraints, TableSpec, check_seed

ALGORITHMS = ("neuroshard", *HEURISTICS, "torchrec")


def parse_constraints(pins: list[str] | None = None, no_split: list[str] | None = None) -> PlanConstraints:
    """Constraints from command-line strings: pins as ``table=rank``, no_split as table names."""
    parsed = {}
    for item in pins or []:
        name, sep, rank = item.partition("=")
        name = name.strip()
        if not sep or not name or not rank.strip().isdigit():
            raise DistrecError(f"pin {item!r} must look like table=rank, e.g. user_id=0")
        if name in parsed:
            raise DistrecError(f"table {name!r} is pinned twice (--pin {name}={parsed[name]} and --pin {item}); pin each table once")
        parsed[name] = int(rank)
    return PlanConstraints(parsed, frozenset(no_split or []))


def tables_per_rank(plan: ShardingPlan) -> list[list[str]]:
    """Per rank, what it holds: table names, with the shard's range for split tables
    (``t3 cols 0:16``, ``t7 rows 0:5000``) and ``(replica)`` for data-parallel copies."""
    held: list[list[str]] = [[] for _ in range(plan.world_size)]
    for p in plan.tables:
        for s in p.shards:
            if p.sharding == "column_wise":
                label = f"{p.table} cols {s.col_start}:{s.col_end}"
            elif p.sharding == "row_wise":
                label = f"{p.table} rows {s.row_start}:{s.row_end}"
            else:
                label = p.table + (" (replica)" if p.sharding == "data_parallel" else "")
            held[s.rank].append(label)
    return held


def format_report(report: dict) -> str:
    """The lines ``distrec plan`` prints: per-device bytes, tables and predicted costs, search time, cache."""
    lines = [f"{report['algorithm']} plan for {report['devices']} devices, search {report['search_time_s']:.2f} s"]
    predicted = report.get("predicted_ms")
    held = report.get("tables_per_device")
    for rank, used in enumerate(report["bytes_per_device"]):
        line = f"  rank {rank}: {used / 2**20:8.1f} MiB"
        if predicted:
            parts = ", ".join(f"{k} {predicted[k][rank]:.2f}" for k in ("compute", "fw_comm", "bw_comm"))
            line += f"  predicted {predicted['total'][rank]:.2f} ms ({parts})"
        lines.append(line)
        if held is not None:
            lines.append(f"    holds {', '.join(held[rank]) or 'nothing'}")
    if predicted:
        lines.append(f"  predicted cost (max over devices): {report['predicted_max_ms']:.2f} ms")
    if "cache_hit_rate" in report:
        lines.append(f"  cost cache hit rate {report['cache_hit_rate']:.1%} over {report['states_evaluated']} split choices")
    if "cost_models_hardware" in report:
        hw = report["cost_models_hardware"]
        lines.append(f"  cost models measured on {hw.get('device_type')} {hw.get('device_name')} with torch {hw.get('torch')}")
    return "\n".join(lines)


def plan_tables(
    tables: list[TableSpec],
    devices: int,
    memory_per_device: int,
    cost_models: CostModels | None = None,
    algorithm: str = "neuroshard",
    constraints: PlanConstraints | None = None,
    seed: int = 0,
    options: SearchOptions | None = None,
    batch_size: int | None = None,
) -> tuple[ShardingPlan, dict]:
    """Shard ``tables`` over ``devices`` devices of ``memory_per_device`` bytes.

    Args:
        tables: the tables with their access statistics.
        devices: number of ranks.
        memory_per_device: bytes of table weights each rank may hold.
        cost_models: trained cost models; needed by neuroshard, optional for the heuristics
            and torchrec (then the report also holds their predicted costs).
        algorithm: one of ``ALGORITHMS`` (``torchrec`` needs the optional torchrec extra).
        constraints: pins and no-split tables.
        seed: seed of the random heuristic.
        options: NeuroShard search options (paper defaults).
        batch_size: samples per training step over all devices, for torchrec's storage and
            cost estimates; default the cost models' batch size, else TorchRec's default.

    Returns:
        (plan, report): the validated ShardingPlan, and a JSON-ready dict with the algorithm,
        the search time (s), bytes and tables per device (``tables_per_rank``), predicted per-device costs (ms) and, for
        neuroshard, the cache hit rate and the chunk sets evaluated.

    Example:
        >>> plan, report = plan_tables(tables, 4, 64 * 2**20, algorithm="size-greedy")
        >>> plan.save("plan.json")
    """
    if algorithm not in ALGORITHMS:
        raise DistrecError(f"unknown planning algorithm {algorithm!r}; choose one of: {', '.join(ALGORITHMS)}")
    if devices < 1 or memory_per_device < 1:
        raise DistrecError(f"need at least 1 device and 1 byte per device, got {devices} devices of {memory_per_device} bytes")
    check_seed(seed)
    names = [t.name for t in tables]
    if not tables or len(set(names)) != len(names):
        raise DistrecError("the planner needs a non-empty list of tables with unique names")
    constraints = constraints or PlanConstraints()
    constraints.check(tables, devices)
    check_feasible(tables, devices, memory_per_device, constraints)
    report: dict = {"algorithm": algorithm, "devices": devices, "memory_per_device": memory_per_device}
    if algorithm == "torchrec" and not constraints.pins:
        require_torchrec()  # its import (seconds) is not planning time
    start = time.perf_counter()
    if algorithm == "neuroshard":
        if cost_models is None:
            raise DistrecError("the neuroshard algorithm needs cost models; train them with 'distrec plan train-cost-models'")
        result = NeuroShardSearch(tables, devices, memory_per_device, cost_models.predictor(devices), constraints, options).run()
        plan = build_plan(tables, result.chunks, result.device_of, devices)
        report.update(cache_hit_rate=result.cache_hit_rate, states_evaluated=result.states)
    elif algorithm == "torchrec":
        if batch_size is None and cost_models is not None:
            batch_size = cost_models.batch_size
        plan = torchrec_plan(tables, devices, memory_per_device, constraints, batch_size)
    else:
        device_of = heuristic_placement(tables, devices, memory_per_device, algorithm, constraints, seed)
        plan = build_plan(tables, whole_tables(tables), device_of, devices)
    report["search_time_s"] = time.perf_counter() - start
    plan.validate([t.to_config() for t in tables], memory_per_device)
    report["bytes_per_device"] = plan.bytes_per_rank()
    report["tables_per_device"] = tables_per_rank(plan)
    if cost_models is not None:
        costs = cost_models.predictor(devices).placement_costs(device_tables(plan, tables))
        report["predicted_ms"] = {k: v.tolist() for k, v in costs.items()}
        report["predicted_max_ms"] = float(costs["total"].max())
        report["cost_models_hardware"] = cost_models.hardware
    return plan, report
