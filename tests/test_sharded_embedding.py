"""The sharded embedding collection equals plain per-table embedding bags (values and grads)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.embedding import EmbeddingBagCollection
from distrec.parallel.plan import Shard, ShardingPlan, TablePlacement
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection
from distrec.tables import TableConfig
from multiprocess import run_distributed

TABLES = [TableConfig(f"t{i}", rows, 8, multi_hot=True) for i, rows in enumerate([50, 37, 64, 20, 11])]


def _plan(kind: str, world: int) -> ShardingPlan:
    placements = []
    for i, t in enumerate(TABLES):
        k = kind if kind != "mixed" else ["table_wise", "column_wise", "row_wise", "data_parallel", "table_wise"][i]
        if k == "rank_zero":  # every table on rank 0: the other ranks only send and receive
            k, shards = "table_wise", [Shard(0, 0, t.num_rows, 0, t.dim)]
        elif k == "table_wise":
            shards = [Shard(i % world, 0, t.num_rows, 0, t.dim)]
        elif k == "column_wise":
            cuts = [0, 4, 6, 8] if world > 2 else [0, 4, 8]
            shards = [Shard((i + j) % world, 0, t.num_rows, a, b) for j, (a, b) in enumerate(zip(cuts, cuts[1:]))]
        elif k == "row_wise":
            cuts = [round(t.num_rows * j / world) for j in range(world + 1)]
            shards = [Shard(j, a, b, 0, t.dim) for j, (a, b) in enumerate(zip(cuts, cuts[1:]))]
        else:
            shards = [Shard(r, 0, t.num_rows, 0, t.dim) for r in range(world)]
        placements.append(TablePlacement(t.name, k, shards))
    return ShardingPlan(world, placements)


def _global_batch(batch_size: int, seed: int, empty: tuple[int, ...] = ()) -> Batch:
    """Random bags of 0-3 indices; every bag of the features ``empty`` empty."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(TABLES), batch_size), generator=g)  # includes empty bags
    lengths[list(empty)] = 0
    values = torch.cat([torch.randint(0, t.num_rows, (int(lengths[f].sum()),), generator=g) for f, t in enumerate(TABLES)])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    return Batch(torch.randn(batch_size, 3, generator=g), values, offsets, torch.zeros(batch_size))


def _full_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {t.name: torch.randn(t.num_rows, t.dim, generator=g) for t in TABLES}


def _reference(batch: Batch, weights: dict[str, torch.Tensor], upstream: torch.Tensor):
    """Pooled [B, F, D] and full-table gradients of sum(pooled * upstream)."""
    params = {k: v.clone().requires_grad_() for k, v in weights.items()}
    lengths = batch.lengths()
    outs = []
    for f, t in enumerate(TABLES):
        offsets = torch.cumsum(lengths[f], 0) - lengths[f]
        outs.append(F.embedding_bag(batch.feature_values(f), params[t.name], offsets, mode="sum"))
    pooled = torch.stack(outs, 1)
    (pooled * upstream).sum().backward()
    return pooled.detach(), {k: p.grad for k, p in params.items()}


def _check_rank(
    rank: int, world: int, kind: str, batch_size: int, features: list[int] | None = None, index_dtype: torch.dtype = torch.int32
) -> tuple[int, int]:
    """Forward and backward against plain embedding bags; with ``features``, only those are
    exchanged and every other feature's bags are empty; the bags travel as ``index_dtype``.
    Returns the input and the output exchange's bytes."""
    torch.manual_seed(0)
    plan = _plan(kind, world)
    weights = _full_weights()
    batch = _global_batch(batch_size, seed=3, empty=tuple(f for f in range(len(TABLES)) if features is not None and f not in features))
    upstream = torch.randn(batch_size, len(TABLES), 8, generator=torch.Generator().manual_seed(5))
    ref_out, ref_grads = _reference(batch, weights, upstream)

    module = ShardedEmbeddingBagCollection.from_full_weights(TABLES, plan, weights)
    assert module.index_dtype == torch.int32  # the tables' rows fit
    module.index_dtype = index_dtype
    per = batch_size // world
    lo, hi = rank * per, (rank + 1) * per if rank < world - 1 else batch_size
    out = module(batch.slice(lo, hi), features)
    torch.testing.assert_close(out, ref_out[lo:hi], rtol=1e-6, atol=1e-6)
    (out * upstream[lo:hi]).sum().mul(world).backward()
    module.sync_replica_grads()
    for unit, _ in module.local_blocks():
        k = module.local_units.index(unit)
        weight = module.weights[module.unit_group[k]]
        grad = weight.grad.to_dense() if weight.grad is not None else torch.zeros_like(weight)  # None: no unit of its width looked up
        base = module.unit_base[k]
        got = grad[base : base + unit.num_rows]
        want = ref_grads[unit.table][unit.row_start : unit.row_end, unit.col_start : unit.col_end]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for p, i in zip(module.replicas, module.replicated):
        torch.testing.assert_close(p.grad.to_dense(), ref_grads[TABLES[i].name], rtol=1e-5, atol=1e-5)
    return module.stats.input_bytes, module.stats.output_bytes


@pytest.mark.parametrize("kind", ["table_wise", "column_wise", "row_wise", "data_parallel", "mixed", "rank_zero"])
def test_two_ranks_match_plain_embedding_bags(kind):
    run_distributed(_check_rank, 2, kind, 10)


def test_four_ranks_mixed_plan_with_uneven_batch():
    run_distributed(_check_rank, 4, "mixed", 11)


@pytest.mark.parametrize("world", [2, 4])
def test_exchanging_only_the_features_with_indices_matches_and_sends_less(world):
    """Features 1 (column-wise) and 4 (table-wise) have no indices and stay out of the
    exchange: the same vectors and gradients, their zero vectors not sent."""
    full = [sent[1] for sent in run_distributed(_check_rank, world, "mixed", 11, None)]
    some = [sent[1] for sent in run_distributed(_check_rank, world, "mixed", 11, [0, 2, 3])]
    for rank in range(world):
        assert some[rank] < full[rank] or full[rank] == 0
    assert sum(some) < sum(full)


def test_bags_travel_as_int32_and_as_int64_alike():
    """Tables whose rows fit int32 send their bags as int32: half the bytes of int64 (bar the
    counts), the same vectors and gradients."""
    narrow = run_distributed(_check_rank, 2, "mixed", 10)
    wide = run_distributed(_check_rank, 2, "mixed", 10, None, torch.int64)
    counts = 2 * 2 * 8  # (batch size, index count) per destination, int64
    for (narrow_in, narrow_out), (wide_in, wide_out) in zip(narrow, wide):
        assert wide_in - counts == 2 * (narrow_in - counts) > 0
        assert narrow_out == wide_out


def _index_beyond_int32(rank: int, world: int) -> str:
    module = ShardedEmbeddingBagCollection.from_full_weights(TABLES, _plan("table_wise", world), _full_weights())
    batch = _global_batch(4, seed=rank)
    batch.sparse_values[batch.sparse_offsets[2 * 4]] = 2**32 + 3  # would wrap to row 3 of table t2
    try:
        module(batch)
    except DistrecError as e:
        return str(e)
    return ""


def test_an_index_that_would_wrap_in_int32_is_a_clear_error():
    messages = run_distributed(_index_beyond_int32, 2)
    assert all(m == "sparse feature 't2' has index 4294967299 but its table has 64 rows; hash indices into [0, 64) or enlarge the table" for m in messages)


def _wrong_world(rank: int, world: int) -> str:
    try:
        ShardedEmbeddingBagCollection(TABLES, _plan("table_wise", 3))
    except DistrecError as e:
        return str(e)
    return ""


def test_plan_for_another_world_size_is_a_clear_error():
    messages = run_distributed(_wrong_world, 2)
    assert all("plan is for 3 ranks but 2 are running" in m for m in messages)


def _replica_grads_when_one_rank_has_none(rank: int, world: int) -> list[torch.Tensor]:
    module = ShardedEmbeddingBagCollection.from_full_weights(TABLES, _plan("data_parallel", world), _full_weights())
    batch = _global_batch(4, seed=rank)
    module(batch).sum().backward()
    if rank == 1:
        module.replicas[2].grad = None  # e.g. a table this rank's micro-batch never touched
    module.sync_replica_grads()
    return [(p.grad.to_dense() if p.grad is not None else None) for p in module.replicas]


def test_replicated_gradients_average_over_ranks_even_where_one_rank_has_none():
    """All tables' entries travel in one exchange; a rank without a gradient contributes zeros, not a hang."""
    got = run_distributed(_replica_grads_when_one_rank_has_none, 2)
    for rank in range(2):
        for t, table in enumerate(TABLES):
            grads = []
            for source in range(2):
                lookups = _global_batch(4, seed=source)
                counts = torch.bincount(lookups.feature_values(t), minlength=table.num_rows).float()
                grads.append(counts[:, None].expand(-1, table.dim) if not (source == 1 and t == 2) else torch.zeros(table.num_rows, table.dim))
            torch.testing.assert_close(got[rank][t], (grads[0] + grads[1]) / 2)


def _initialised_shards(rank: int, world: int) -> None:
    tables = [TableConfig("big", 140_000, 8), TableConfig("small", 30, 8), TableConfig("wide", 70_000, 8)]
    plan = ShardingPlan(
        world,
        [
            TablePlacement("big", "row_wise", [Shard(0, 0, 70_001, 0, 8), Shard(1, 70_001, 140_000, 0, 8)]),  # cuts a generator block
            TablePlacement("small", "data_parallel", [Shard(r, 0, 30, 0, 8) for r in range(world)]),
            TablePlacement("wide", "column_wise", [Shard(1, 0, 70_000, 0, 4), Shard(0, 0, 70_000, 4, 8)]),
        ],
    )
    torch.manual_seed(3)
    single = EmbeddingBagCollection(tables)
    module = ShardedEmbeddingBagCollection.from_initializer(tables, plan, single.initializer)
    assert len(module.local_blocks()) == 2
    for unit, block in module.local_blocks():
        assert torch.equal(block, single.table_weight(unit.table)[unit.row_start : unit.row_end, unit.col_start : unit.col_end])
    for p, i in zip(module.replicas, module.replicated):
        assert torch.equal(p, single.table_weight(tables[i].name))


def test_shards_made_from_the_initializer_equal_the_single_process_tables():
    """Each rank makes only its own blocks, with the values the whole tables have in one process."""
    run_distributed(_initialised_shards, 2)
