"""The default sharding plans: size-greedy table-wise, with a row-wise fallback under a memory limit."""

import pytest

from distrec.errors import DistrecError
from distrec.parallel.default_plans import greedy_plan, uniform_plan
from distrec.planner.heuristics import heuristic_placement
from distrec.planner.types import TableSpec
from distrec.tables import TableConfig

TABLES = [TableConfig(f"t{i}", rows, dim) for i, (rows, dim) in enumerate([(1000, 16), (50, 8), (4000, 4), (300, 32), (20, 16), (2500, 8)])]


def test_greedy_plan_places_tables_as_the_planners_size_greedy():
    plan = greedy_plan(TABLES, 3)
    specs = [TableSpec(t.name, t.num_rows, t.dim, 1.0, [1.0] + [0.0] * 16) for t in TABLES]
    assert [p.shards[0].rank for p in plan.tables] == heuristic_placement(specs, 3, 2**40, "size-greedy")
    assert {p.sharding for p in plan.tables} == {"table_wise"}


def test_a_table_too_large_for_one_rank_is_split_row_wise():
    big = TableConfig("big", 10_000, 16)
    memory = big.num_bytes // 2 + sum(t.num_bytes for t in TABLES)
    plan = greedy_plan([*TABLES, big], 2, memory)
    by_name = {p.table: p for p in plan.tables}
    assert by_name["big"].sharding == "row_wise"
    assert sorted(s.rank for s in by_name["big"].shards) == [0, 1]
    assert all(by_name[t.name].sharding == "table_wise" for t in TABLES)
    plan.validate([*TABLES, big], memory)


def test_tables_that_fit_nowhere_are_one_error():
    with pytest.raises(DistrecError, match="cannot hold them"):
        greedy_plan(TABLES, 2, 1024)


def test_uniform_table_wise_is_the_greedy_plan():
    assert uniform_plan(TABLES, 2, "table_wise") == greedy_plan(TABLES, 2)
