"""Baseline heuristics: memory limits, determinism, pins, and the greedy rule itself."""

import pytest

from distrec.errors import DistrecError
from distrec.planner.heuristics import HEURISTICS, heuristic_placement
from distrec.planner.table_pool import generate_tasks, make_table_pool
from distrec.planner.types import PlanConstraints, TableSpec

HIST = (1.0,) + (0.0,) * 16


def table(name, rows, dim, pooling=1.0):
    return TableSpec(name, rows, dim, pooling, HIST)


@pytest.fixture(scope="module")
def task():
    pool = make_table_pool(seed=0)
    # max dim 16 keeps every table small enough for one device, so every heuristic succeeds
    return generate_tasks(pool, 1, 4, max_dim=16, seed=2)[0]


@pytest.mark.parametrize("algorithm", HEURISTICS)
def test_heuristics_respect_memory_and_are_deterministic(task, algorithm):
    memory = task.memory_per_device
    device_of = heuristic_placement(task.tables, 4, memory, algorithm, seed=5)
    assert device_of == heuristic_placement(task.tables, 4, memory, algorithm, seed=5)
    used = [0] * 4
    for t, d in zip(task.tables, device_of):
        used[d] += t.num_bytes
    assert max(used) <= memory
    assert len(set(device_of)) > 1


def test_random_depends_on_the_seed(task):
    a = heuristic_placement(task.tables, 4, task.memory_per_device, "random", seed=1)
    b = heuristic_placement(task.tables, 4, task.memory_per_device, "random", seed=2)
    assert a != b


def test_greedy_puts_each_table_on_the_least_loaded_device():
    # sizes 4, 3, 2, 1 (x 400 bytes): size-greedy gives {4, 1} and {3, 2}
    tables = [table(n, rows, 100) for n, rows in (("d", 1), ("a", 4), ("c", 2), ("b", 3))]
    device_of = heuristic_placement(tables, 2, 10**6, "size-greedy")
    assert dict(zip("dacb", device_of)) == {"a": 0, "b": 1, "c": 1, "d": 0}


def test_greedy_costs_differ_by_heuristic():
    # dim-greedy sees the 64-dim table as heaviest; lookup-greedy the 8-dim one pooled 100x
    tables = [table("wide", 10, 64, 1.0), table("hot", 10, 8, 100.0), table("x", 10, 4, 1.0), table("y", 10, 4, 1.0)]
    dim = heuristic_placement(tables, 2, 10**6, "dim-greedy")
    lookup = heuristic_placement(tables, 2, 10**6, "lookup-greedy")
    assert dim[0] == 0 and dim[1] == 1 and dim[2] == dim[3] == 1  # the wide table alone on rank 0
    assert lookup[1] == 0 and lookup[0] == 1  # the hot table first, on rank 0


def test_memory_limit_sends_tables_elsewhere_or_fails():
    tables = [table("a", 100, 4), table("b", 100, 4), table("c", 100, 4)]  # 1600 bytes each
    device_of = heuristic_placement(tables, 2, 3200, "size-greedy")
    assert sorted(device_of) == [0, 0, 1] or sorted(device_of) == [0, 1, 1]
    with pytest.raises(DistrecError, match="no device with memory"):
        heuristic_placement(tables, 2, 2000, "size-greedy")


def test_pins_are_honoured():
    tables = [table(f"t{i}", 10 * (i + 1), 4) for i in range(6)]
    pins = PlanConstraints(pins={"t5": 2, "t4": 2})
    for algorithm in HEURISTICS:
        device_of = heuristic_placement(tables, 3, 10**6, algorithm, pins)
        assert device_of[5] == 2 and device_of[4] == 2
    with pytest.raises(DistrecError, match="rank 3"):
        heuristic_placement(tables, 3, 10**6, "dim-greedy", PlanConstraints(pins={"t0": 3}))
    with pytest.raises(DistrecError, match="unknown"):
        heuristic_placement(tables, 3, 10**6, "nope")
