"""Execute sharding plans for real: embedding lookups and all-to-alls on D processes.

Each rank builds the tables (or column shards) a plan gives it, with index batches drawn
from the tables' pooling factors and histograms, and runs training steps: forward and
backward lookups with an SGD update (``compute``), then the forward all-to-all of its
pooled outputs (sized by the per-device dimension sums) and the backward all-to-all of the
gradients. A device's cost is compute + forward + backward all-to-all (ms); a plan costs the
maximum over devices, as in the NeuroShard evaluation.

The step is laid out as in steady-state training: after the backward all-to-all, a rank
runs its backward lookups and the next forward lookups, so its forward all-to-all starts
late by its compute time; the all-to-all makes early ranks wait for late ones.

With ``share_cores`` (the default on the CPU, where D processes share a few cores), ranks
first time every plan's compute, each rank alone as on a device of its own, in thread CPU
time as the compute micro-benchmark does (see ``workload.compute_ms``). The plans of a task
(consecutive plans placing the same tables) take turns: in each round every rank in turn
runs one step of each of the task's plans back to back, and a (plan, device) keeps its
minimum over the rounds, so load from other jobs on the machine falls on every plan of the
task alike rather than on whichever plan was timed in a busy slot. The timed steps then
sleep for that time in place of the compute before their all-to-alls, and all plans take
turns step by step (round robin, ``step_repeats`` rounds, the median per plan) for the
same reason. Without it (the default on accelerators) every step computes for real, all
ranks in parallel, plan after plan. The all-to-alls are always real and timed by the wall
clock: waiting for late ranks is part of them.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tqdm import tqdm

from distrec.parallel.plan import ShardingPlan
from distrec.planner.emit import device_tables
from distrec.planner.launch import spawn_group
from distrec.planner.types import TableSpec
from distrec.planner.workload import LookupWorkload, communication_step, default_device, timed_ms

COST_PARTS = ("compute", "fw_comm", "bw_comm", "total")


def execute_plans(
    plans: list[tuple[ShardingPlan, list[TableSpec]]],
    batch_size: int = 4096,
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
    device: str | torch.device | None = None,
    share_cores: bool | None = None,
    progress: bool = False,
    step_repeats: int | None = None,
) -> list[dict[str, list[float]]]:
    """Run every plan (all for the same world size) in one group of spawned processes.

    Args:
        plans: (plan, the tables it places) pairs with equal ``world_size``.
        batch_size: samples per step (a multiple of the world size).
        warmup: compute rounds and steps (all-to-alls) discarded before timing.
        repeats: compute rounds timed with ``share_cores`` (one run of every plan of a task
            per round; the minimum per plan and device is used).
        seed: seed of the weights and index batches.
        device: device type; defaults to the accelerator, else the CPU.
        share_cores: time-multiplex the ranks' compute (see the module doc); None = on the CPU.
        progress: show a tqdm bar over the plans (only on a terminal).
        step_repeats: timed training steps per plan, whose median is reported (default
            ``repeats``). With ``share_cores`` a step costs only its sleep and all-to-alls,
            so many steps are cheap and tame the all-to-all noise.

    Returns:
        Per plan, per-device median costs in ms under ``compute``, ``fw_comm``, ``bw_comm``
        and ``total``; the plan's cost is ``max(result["total"])``.
    """
    if not plans:
        return []
    world = plans[0][0].world_size
    if any(p.world_size != world for p, _ in plans):
        raise ValueError("execute_plans needs plans of one world size")
    dev = torch.device(device) if device is not None else default_device()
    share = dev.type == "cpu" if share_cores is None else share_cores
    layouts = [device_tables(plan, tables) for plan, tables in plans]
    groups = task_groups([tables for _, tables in plans])
    results = mp.get_context("spawn").SimpleQueue()
    show = progress and sys.stderr.isatty()
    steps = repeats if step_repeats is None else step_repeats
    spawn_group(_execute_worker, world, dev.type, (layouts, groups, batch_size, warmup, repeats, steps, seed, share, show, results))
    return results.get()


def compute_in_rounds(steps: list[Callable[[], object]], warmup: int, rounds: int, device: torch.device) -> list[float]:
    """This rank's compute time (ms) of every step function: the minimum over ``rounds``
    rounds after ``warmup``, each round running every function once, back to back, while
    the other ranks wait their turn."""
    rank, world = dist.get_rank(), dist.get_world_size()
    best = [math.inf] * len(steps)
    for round_ in range(warmup + rounds):
        for turn in range(world):
            dist.barrier()
            if turn != rank:
                continue
            for i, step in enumerate(steps):
                ms = timed_ms(step, device)[1]
                if round_ >= warmup:
                    best[i] = min(best[i], ms)
    dist.barrier()
    return best


def task_groups(tables: list[list[TableSpec]]) -> list[range]:
    """Indices of consecutive plans that place the same tables (the plans of one task)."""
    starts = [i for i in range(len(tables)) if i == 0 or tables[i] != tables[i - 1]]
    return [range(a, b) for a, b in zip(starts, [*starts[1:], len(tables)])]


def _summary(rows: list[tuple[float, float, float]]) -> dict[str, float]:
    """Median compute, forward and backward all-to-all over timed steps, and their sum (ms)."""
    med = np.median(np.array(rows), axis=0)
    return {"compute": float(med[0]), "fw_comm": float(med[1]), "bw_comm": float(med[2]), "total": float(med.sum())}


def run_steps(
    tables: list[TableSpec],
    dim_sums: list[int],
    batch_size: int,
    warmup: int,
    step_repeats: int,
    rng: np.random.Generator,
    device: torch.device,
) -> dict[str, float]:
    """This rank's median compute, all-to-all and total times (ms) over ``step_repeats`` real
    training steps with ``tables``, every rank computing at once."""
    rank = dist.get_rank()
    workload = LookupWorkload(tables, batch_size, device, rng)
    grad = torch.ones(batch_size, dim_sums[rank], device=device)
    rows: list[tuple[float, float, float]] = []
    for _ in range(warmup + step_repeats):
        dist.barrier()
        pooled, compute = timed_ms(lambda: workload.step(grad), device)
        grad, fw, bw = communication_step(pooled, dim_sums, rank, device)
        rows.append((compute, fw, bw))
    return _summary(rows[warmup:])


def run_interleaved_steps(
    computes: list[float], dim_sums: list[list[int]], batch_size: int, warmup: int, step_repeats: int, device: torch.device
) -> list[dict[str, float]]:
    """This rank's median costs (ms) of every plan, its steps taken in turns with the other plans'.

    A step of plan p sleeps ``computes[p]`` (this rank's compute time in that plan) and then
    runs the plan's all-to-alls; each round runs one step of every plan.
    """
    rank = dist.get_rank()
    buffer = torch.randn(batch_size * max(max(d[rank] for d in dim_sums), 1), device=device)
    rows: list[list[tuple[float, float, float]]] = [[] for _ in computes]
    for step in range(warmup + step_repeats):
        for p, (compute, sums) in enumerate(zip(computes, dim_sums)):
            pooled = buffer[: batch_size * sums[rank]].view(batch_size, sums[rank])
            dist.barrier()
            time.sleep(compute / 1e3)
            _, fw, bw = communication_step(pooled, sums, rank, device)
            if step >= warmup:
                rows[p].append((compute, fw, bw))
    return [_summary(r) for r in rows]


def _execute_worker(rank, world, device, layouts, groups, batch_size, warmup, repeats, step_repeats, seed, share_cores, show, results) -> None:
    dim_sums = [[sum(t.dim for t in ts) for ts in layout] for layout in layouts]
    bar = tqdm(total=len(layouts), desc="executing plans", unit="plan", disable=not (show and rank == 0))
    mine = []
    if share_cores:
        computes = []
        for group in groups:  # one task's workloads at a time, each plan's share of its tables
            workloads = [LookupWorkload(layouts[i][rank], batch_size, device, np.random.default_rng([seed, i, rank])) for i in group]
            computes += compute_in_rounds([w.step for w in workloads], warmup, repeats, device)
            del workloads  # freed before the next task's are built
            bar.update(len(group))
        mine = run_interleaved_steps(computes, dim_sums, batch_size, warmup, step_repeats, device)
    else:
        for index, layout in enumerate(layouts):
            mine.append(run_steps(layout[rank], dim_sums[index], batch_size, warmup, step_repeats, np.random.default_rng([seed, index, rank]), device))
            bar.update()
    bar.close()
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        results.put([{part: [costs[index][part] for costs in every] for part in COST_PARTS} for index in range(len(layouts))])
