"""Executing plans on two gloo processes: every device reports compute and all-to-all times."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distrec.parallel import comm
from distrec.planner import execute, launch
from distrec.planner.api import plan_tables
from distrec.planner.execute import COST_PARTS, compute_in_rounds, execute_plans, task_groups
from distrec.planner.launch import spawn_group
from distrec.planner.types import TableSpec

HIST = (0.6, 0.3, 0.1) + (0.0,) * 14


@pytest.mark.parametrize("share_cores", [True, False])
def test_execute_two_plans_on_two_processes(share_cores):
    """Interleaved steps after compute in turns (CPU default) and real parallel steps give the same report."""
    tables = [TableSpec(f"t{i}", 500 * (i + 1), 8 * (i % 3 + 1), 2.0 + i, HIST) for i in range(5)]
    plans = [plan_tables(tables, 2, 10**6, algorithm=a)[0] for a in ("size-greedy", "dim-greedy")]
    results = execute_plans([(p, tables) for p in plans], batch_size=32, warmup=1, repeats=2, progress=False, step_repeats=4, share_cores=share_cores)
    assert len(results) == 2
    for r in results:
        assert set(r) == set(COST_PARTS) and all(len(v) == 2 for v in r.values())
        for d in range(2):
            assert min(r[part][d] for part in COST_PARTS) > 0
            assert r["total"][d] == pytest.approx(r["compute"][d] + r["fw_comm"][d] + r["bw_comm"][d])


def test_task_groups_are_runs_of_plans_placing_the_same_tables():
    a, b = [TableSpec("a", 10, 4, 1.0, HIST)], [TableSpec("b", 10, 4, 1.0, HIST)]
    assert task_groups([a, list(a), b, a]) == [range(0, 2), range(2, 3), range(3, 4)]
    assert task_groups([]) == []


def test_compute_in_rounds_runs_the_plans_in_turn_and_keeps_each_minimum(monkeypatch):
    """Each round runs every plan once in order; warm-up rounds are not counted."""
    times = iter([100.0, 100.0, 9.0, 5.0, 4.0, 7.0, 6.0, 8.0])  # warm-up round, then two timed rounds
    calls = []
    monkeypatch.setattr(execute, "timed_ms", lambda fn, device: (fn(), next(times)))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        best = compute_in_rounds([lambda: calls.append(0), lambda: calls.append(1)], 1, 3, torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    assert calls == [0, 1] * 4
    assert best == [4.0, 5.0]


def _sum_of_ranks(rank, world, device, results) -> None:
    total = torch.tensor([rank])
    dist.all_reduce(total)
    if rank == 0:
        results.put(int(total))


def test_a_port_taken_while_the_processes_start_cannot_break_the_group(monkeypatch):
    """The group's port is held from before the processes start: a port picked free and bound
    by rank 0 seconds later (process start-up under load) could be taken in between by another
    job, and the group failed to start."""
    taken, free_port = [], comm.free_port

    def free_then_taken() -> int:
        port = free_port()
        other = socket.socket()
        other.bind(("127.0.0.1", port))
        other.listen()  # another job's listener got there first
        taken.append(other)
        return port

    monkeypatch.setattr(comm, "free_port", free_then_taken)
    monkeypatch.setattr(launch, "free_port", free_then_taken, raising=False)
    results = mp.get_context("spawn").SimpleQueue()
    try:
        spawn_group(_sum_of_ranks, 2, "cpu", (results,))
    finally:
        for other in taken:
            other.close()
    assert results.get() == 1
