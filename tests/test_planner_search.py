"""NeuroShard search and plan_tables: memory, dims divisible by 4, constraints, cache, errors."""

import json

import numpy as np
import pytest
import torch

from distrec.errors import DistrecError
from distrec.parallel.plan import ShardingPlan
from distrec.planner.api import ALGORITHMS, format_report, parse_constraints, plan_tables
from distrec.planner.cost_models import CommCostNet, ComputeCostNet, ComputeEnsemble, CostModels
from distrec.planner.search import NeuroShardSearch, SearchOptions
from distrec.planner.table_pool import generate_tasks, make_table_pool
from distrec.planner.types import PlanConstraints, TableSpec

HIST = (0.5, 0.5) + (0.0,) * 15
SHORT = SearchOptions(max_steps=3, grid_points=5)  # keeps the tests fast


def untrained_cost_models(devices: int, seed: int = 0) -> CostModels:
    """Randomly initialised nets: enough to drive the search deterministically."""
    torch.manual_seed(seed)
    return CostModels(ComputeEnsemble([ComputeCostNet()]), {devices: (CommCostNet.forward_model(), CommCostNet.backward_model())}, 1024, {})


@pytest.fixture(scope="module")
def models():
    return untrained_cost_models(4)


@pytest.fixture(scope="module")
def task():
    """A 4-device task whose largest table does not fit one device whole."""
    pool = make_table_pool(seed=0)
    tasks = generate_tasks(pool, 30, 4, max_dim=128, seed=1)
    return next(t for t in tasks if max(x.num_bytes for x in t.tables) > t.memory_per_device and len(t.tables) < 20)


def shard_widths(plan):
    return [s.col_end - s.col_start for p in plan.tables for s in p.shards]


def test_plan_respects_memory_and_splits_columns_in_multiples_of_four(task, models):
    plan, report = plan_tables(task.tables, 4, task.memory_per_device, models)
    plan.validate([t.to_config() for t in task.tables], task.memory_per_device)
    assert max(report["bytes_per_device"]) <= task.memory_per_device
    assert all(w % 4 == 0 for w in shard_widths(plan))
    assert any(p.sharding == "column_wise" for p in plan.tables)  # the oversized table was split
    assert report["cache_hit_rate"] > 0 and report["states_evaluated"] > 1
    assert len(report["predicted_ms"]["total"]) == 4 and report["predicted_max_ms"] == max(report["predicted_ms"]["total"])
    text = format_report(report)
    assert text.count("rank ") == 4 and "cache hit rate" in text and "predicted cost" in text


def test_plan_json_round_trip_validates(task, models, tmp_path):
    plan, _ = plan_tables(task.tables, 4, task.memory_per_device, models)
    plan.save(tmp_path / "plan.json")
    loaded = ShardingPlan.load(tmp_path / "plan.json")
    loaded.validate([t.to_config() for t in task.tables], task.memory_per_device)
    assert json.loads((tmp_path / "plan.json").read_text()) == plan.to_dict()


def test_pins_and_no_split(task, models):
    big = max(task.tables, key=lambda t: t.num_bytes)
    small = min(task.tables, key=lambda t: t.num_bytes)
    others_fit = [t.name for t in task.tables if t.num_bytes <= task.memory_per_device]
    constraints = PlanConstraints(pins={small.name: 3}, no_split=frozenset(others_fit))
    plan, _ = plan_tables(task.tables, 4, task.memory_per_device, models, constraints=constraints)
    assert [s.rank for s in plan.placement(small.name).shards] == [3]
    assert all(plan.placement(name).sharding == "table_wise" for name in others_fit)
    assert plan.placement(big.name).sharding == "column_wise"


def test_no_split_of_an_oversized_table_is_one_clear_error(task, models):
    big = max(task.tables, key=lambda t: t.num_bytes)
    with pytest.raises(DistrecError, match=f"table '{big.name}' needs .* whole"):
        plan_tables(task.tables, 4, task.memory_per_device, models, constraints=PlanConstraints(no_split=frozenset([big.name])))


def test_infeasible_requests_raise_one_error(models):
    huge = TableSpec("huge", 10_000, 8, 1.0, HIST)  # 4-column shards still take 160,000 bytes
    with pytest.raises(DistrecError, match="even split into 4-column shards"):
        plan_tables([huge], 4, 100_000, models)
    many = [TableSpec(f"t{i}", 1000, 8, 1.0, HIST) for i in range(10)]  # 320 kB in all
    with pytest.raises(DistrecError, match="use more devices"):
        plan_tables(many, 4, 64_000, models)
    with pytest.raises(DistrecError, match="pinned to rank 0"):
        plan_tables(many, 4, 80_000, models, constraints=PlanConstraints(pins={"t0": 0, "t1": 0, "t2": 0}))
    with pytest.raises(DistrecError, match="needs cost models"):
        plan_tables(many, 4, 10**6, None)
    with pytest.raises(DistrecError, match="no communication model for 8"):
        plan_tables(many, 8, 10**6, models)


def test_cache_hits_on_repeated_evaluations_and_can_be_switched_off(task, models):
    predictor = models.predictor(4)
    cached = NeuroShardSearch(task.tables, 4, task.memory_per_device, predictor, options=SHORT).run()
    no_cache = SearchOptions(max_steps=SHORT.max_steps, grid_points=SHORT.grid_points, use_cache=False)
    uncached = NeuroShardSearch(task.tables, 4, task.memory_per_device, predictor, options=no_cache).run()
    assert cached.cache_hits > 0 and cached.cache_hit_rate > 0.5
    assert uncached.cache_hits == 0 and uncached.cache_lookups == cached.cache_lookups
    assert cached.max_cost == pytest.approx(uncached.max_cost)


def test_the_grid_only_adds_to_the_unbounded_placement(task, models):
    predictor = models.predictor(4)
    greedy_only = {"max_steps": 0, "heuristic_placements": False}  # no splits, only the bounded greedy placement
    tightest = SearchOptions(**greedy_only, grid_points=1, grid_max=1.0)  # a single bound: the mean dimension
    full = NeuroShardSearch(task.tables, 4, task.memory_per_device, predictor, options=tightest).run()
    no_grid = NeuroShardSearch(task.tables, 4, task.memory_per_device, predictor, options=SearchOptions(**greedy_only, grid_search=False)).run()
    assert full.max_cost <= no_grid.max_cost


@pytest.mark.parametrize("variant", ["no-split", "no-beam", "no-grid"])
def test_ablations_give_valid_placements(task, models, variant):
    ablated = NeuroShardSearch(task.tables, 4, task.memory_per_device, models.predictor(4), options=SearchOptions.ablation(variant)).run()
    used = [0] * 4
    for chunk, rank in zip(ablated.chunks, ablated.device_of):
        assert chunk.dim % 4 == 0
        used[rank] += task.tables[chunk.table].num_rows * chunk.dim * 4
    assert max(used) <= task.memory_per_device
    assert sorted({c.table for c in ablated.chunks}) == list(range(len(task.tables)))
    if variant == "no-split":  # a table is split only if it does not fit one device whole
        assert all(c.dim == task.tables[c.table].dim for c in ablated.chunks if task.tables[c.table].num_bytes <= task.memory_per_device)


def test_every_algorithm_returns_a_valid_plan(models):
    pool = make_table_pool(seed=0)
    task = generate_tasks(pool, 1, 4, max_dim=16, seed=3)[0]
    configs = [t.to_config() for t in task.tables]
    for algorithm in (a for a in ALGORITHMS if a != "torchrec"):  # torchrec: tests/test_planner_torchrec.py
        plan, report = plan_tables(task.tables, 4, task.memory_per_device, models, algorithm, options=SHORT)
        plan.validate(configs, task.memory_per_device)
        assert report["algorithm"] == algorithm and report["predicted_max_ms"] == max(report["predicted_ms"]["total"])


def test_parse_constraints():
    c = parse_constraints(["user=1", "item = 0"], ["item"])
    assert c.pins == {"user": 1, "item": 0} and c.no_split == {"item"}
    with pytest.raises(DistrecError, match="table=rank"):
        parse_constraints(["user:1"])


def test_search_options_are_checked():
    with pytest.raises(DistrecError, match="out of range"):
        SearchOptions(beam_width=0)
    with pytest.raises(DistrecError, match="unknown search variant"):
        SearchOptions.ablation("no-search")


def test_tight_memory_is_packed_largest_first_when_the_cost_order_fits_nowhere(models):
    """In this task no greedy placement in cost order fits the memory under any dim bound;
    without beam steps only the largest-first fallback can place it."""
    task = generate_tasks(make_table_pool(seed=0), 10, 4, max_dim=128, seed=4)[5]
    plan, report = plan_tables(task.tables, 4, task.memory_per_device, models, options=SearchOptions(max_steps=0))
    plan.validate([t.to_config() for t in task.tables], task.memory_per_device)
    assert report["states_evaluated"] == 1 and all(w % 4 == 0 for w in shard_widths(plan))


def test_neuroshard_is_never_predicted_worse_than_a_greedy_heuristic(models):
    """The search scores the heuristics' placements of the whole tables too, so by its cost
    models no greedy heuristic's plan beats NeuroShard's."""
    pool = make_table_pool(seed=0)
    for task in generate_tasks(pool, 3, 4, max_dim=16, seed=5):
        ours = plan_tables(task.tables, 4, task.memory_per_device, models, options=SHORT)[1]["predicted_max_ms"]
        for algorithm in ("size-greedy", "dim-greedy", "lookup-greedy", "size-lookup-greedy"):
            theirs = plan_tables(task.tables, 4, task.memory_per_device, models, algorithm)[1]["predicted_max_ms"]
            assert ours <= theirs * (1 + 1e-9), algorithm
    without = SearchOptions(max_steps=SHORT.max_steps, grid_points=SHORT.grid_points, heuristic_placements=False)
    assert NeuroShardSearch(task.tables, 4, task.memory_per_device, models.predictor(4), options=without).run().max_cost >= ours - 1e-9


def test_a_column_split_is_never_predicted_cheaper_than_the_whole_table():
    torch.manual_seed(2)
    models = CostModels(ComputeEnsemble([ComputeCostNet() for _ in range(3)]), {4: (CommCostNet.forward_model(), CommCostNet.backward_model())}, 1024, {})
    predictor = models.predictor(4)
    pool = make_table_pool(seed=0)
    tables = [pool.table(i, 64, f"t{i}") for i in range(40)]
    search = NeuroShardSearch(tables, 4, 2**40, predictor)
    offset = float(predictor.device_compute(np.zeros(predictor.embed(tables[:1]).shape[1]))[0])
    raw = [
        float(predictor.device_compute(predictor.embed([t.with_dim(32)] * 2).sum(axis=0))[0]) < predictor.device_compute(predictor.embed([t]))[0]
        for t in tables
    ]
    for i in range(len(tables)):
        whole = search._chunk(i, 64).cost - offset
        assert 2 * (search._chunk(i, 32).cost - offset) >= whole * (1 - 1e-9) and 4 * (search._chunk(i, 16).cost - offset) >= whole * (1 - 1e-9)
    assert any(raw)  # the raw model does predict some splits cheaper: the floor matters
