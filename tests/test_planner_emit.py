"""Plans the planner emits are valid ShardingPlans that the sharded embedding collection runs."""

import pytest
import torch
import torch.nn.functional as F

from distrec.data.batch import Batch
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection
from distrec.planner.api import ALGORITHMS, plan_tables
from distrec.planner.emit import build_plan, device_tables
from distrec.planner.heuristics import HEURISTICS
from distrec.planner.search import SearchOptions
from distrec.planner.types import Chunk, PlanConstraints, TableSpec
from multiprocess import run_distributed
from test_planner_search import untrained_cost_models

HIST = (0.7, 0.2, 0.1) + (0.0,) * 14
DIM = 16
# 39 kB of tables on 2 ranks of 24 kB: t0 (25.6 kB) must be split into column shards
TABLES = [TableSpec(f"t{i}", rows, DIM, 1.0 + i, HIST) for i, rows in enumerate([400, 40, 90, 17, 60, 5])]
MEMORY = 24_000
WHOLE_TABLE_MEMORY = 40_000  # what the table-wise heuristics need


def test_build_plan_merges_adjacent_columns_and_keeps_split_ones():
    chunks = [Chunk(0, 0, 4), Chunk(0, 4, 4), Chunk(0, 8, 8), Chunk(1, 0, 16)]
    plan = build_plan(TABLES[:2], chunks, [0, 1, 0, 1], 2)
    shards = [(s.rank, s.col_start, s.col_end) for s in plan.placement("t0").shards]
    assert plan.placement("t0").sharding == "column_wise" and shards == [(0, 0, 4), (1, 4, 8), (0, 8, 16)]
    merged = build_plan(TABLES[:2], chunks, [1, 1, 1, 0], 2)
    assert merged.placement("t0").sharding == "table_wise" and merged.placement("t0").shards[0].rank == 1
    assert [[t.dim for t in ts] for ts in device_tables(plan, TABLES[:2])] == [[4, 8], [4, 16]]


def _planner_plans():
    models = untrained_cost_models(2)
    plans = {a: plan_tables(TABLES, 2, WHOLE_TABLE_MEMORY, None, a)[0] for a in ALGORITHMS if a not in ("neuroshard", "torchrec")}
    plans["neuroshard"] = plan_tables(TABLES, 2, MEMORY, models, options=SearchOptions(max_steps=4))[0]
    interleaved = [Chunk(0, 0, 4), Chunk(0, 4, 4), Chunk(0, 8, 8)] + [Chunk(i, 0, DIM) for i in range(1, len(TABLES))]
    plans["interleaved"] = build_plan(TABLES, interleaved, [0, 1, 0, 1, 1, 1, 0, 1], 2)  # t0 twice on rank 0
    plans["pinned"] = plan_tables(TABLES, 2, MEMORY, models, constraints=PlanConstraints({"t1": 1}, frozenset(["t2"])))[0]
    return plans


def _batch(batch_size: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(TABLES), batch_size), generator=g)
    values = torch.cat([torch.randint(0, t.num_rows, (int(lengths[f].sum()),), generator=g) for f, t in enumerate(TABLES)])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    return Batch(torch.zeros(batch_size, 1), values, offsets, torch.zeros(batch_size))


def _sharded_minus_reference(rank: int, world: int, plans: dict) -> dict[str, float]:
    """Max |sharded - unsharded| pooled embedding of this rank's samples, per plan."""
    configs = [t.to_config() for t in TABLES]
    g = torch.Generator().manual_seed(1)
    full = {t.name: torch.randn(t.num_rows, t.dim, generator=g) for t in TABLES}
    batch = _batch(8, seed=2)
    lengths = batch.lengths()
    reference = torch.stack(
        [F.embedding_bag(batch.feature_values(f), full[t.name], torch.cumsum(lengths[f], 0) - lengths[f], mode="sum") for f, t in enumerate(TABLES)],
        dim=1,
    )
    out = {}
    for name, plan in plans.items():
        module = ShardedEmbeddingBagCollection.from_full_weights(configs, plan, full)
        mine = module(batch.slice(rank * 4, rank * 4 + 4))
        out[name] = float((mine - reference[rank * 4 : rank * 4 + 4]).abs().max())
    return out


def test_sharded_collection_runs_every_emitted_plan_on_two_gloo_ranks():
    plans = _planner_plans()
    assert plans["neuroshard"].placement("t0").sharding == "column_wise"
    for name, plan in plans.items():
        plan.validate([t.to_config() for t in TABLES], WHOLE_TABLE_MEMORY if name in HEURISTICS else MEMORY)
    for per_rank in run_distributed(_sharded_minus_reference, 2, plans):
        assert set(per_rank) == set(plans)
        assert max(per_rank.values()) == pytest.approx(0.0, abs=1e-5)
