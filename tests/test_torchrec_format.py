"""TorchRec's plan JSON: distrec plans to it and back, TorchRec's shard layouts, loading with ``--plan``."""

import json
from pathlib import Path

import pytest
import torch

from distrec.data import prepare
from distrec.errors import DistrecError
from distrec.parallel.plan import Shard, ShardingPlan, TablePlacement
from distrec.parallel.torchrec_format import (
    distrec_plan_dict,
    is_torchrec_plan,
    placement_from_shards,
    torchrec_dict_from_plan,
)
from distrec.planner.torchrec_planner import torchrec_available
from distrec.tables import TableConfig
from distrec.train.loop import train
from multiprocess import run_distributed
from tiny_runs import tiny_config, train_losses, train_on_rank

TORCHREC_PLAN = Path(__file__).parent / "data" / "torchrec_plan_tiny.json"
"""TorchRec's planner's plan of the tiny run's tables on 2 ranks (tests/data/make_torchrec_plan.py)."""

FIX = "do the fix"


def placement(*args) -> TablePlacement:
    """``placement_from_shards`` as a distrec TablePlacement."""
    return ShardingPlan.from_dict({"world_size": 2, "tables": [placement_from_shards(*args, FIX)]}).tables[0]


def test_table_wise_shard_is_the_whole_table_on_its_rank():
    placed = placement("t", "table_wise", [(1, 0, 100, 0, 16)])
    assert placed.sharding == "table_wise" and placed.shards == [Shard(1, 0, 100, 0, 16)]


def test_column_shards_become_a_valid_column_wise_plan():
    placed = placement("t", "column_wise", [(0, 0, 100, 0, 8), (1, 0, 100, 8, 8)])
    assert placed.sharding == "column_wise"
    assert placed.shards == [Shard(0, 0, 100, 0, 8), Shard(1, 0, 100, 8, 16)]
    ShardingPlan(2, [placed]).validate([TableConfig("t", 100, 16)], memory_per_rank=100 * 8 * 4)


def test_table_column_wise_is_column_wise_and_one_full_shard_is_table_wise():
    assert placement("t", "table_column_wise", [(0, 0, 100, 0, 4), (0, 0, 100, 4, 12)]).sharding == "column_wise"
    assert placement("t", "column_wise", [(1, 0, 100, 0, 16)]).sharding == "table_wise"


@pytest.mark.parametrize("sharding_type", ["row_wise", "table_row_wise"])
def test_row_shards_become_a_valid_row_wise_plan(sharding_type):
    placed = placement("t", sharding_type, [(0, 0, 50, 0, 16), (1, 50, 50, 0, 16)])
    assert placed.sharding == "row_wise" and placed.shards[1] == Shard(1, 50, 100, 0, 16)
    ShardingPlan(2, [placed]).validate([TableConfig("t", 100, 16)])


@pytest.mark.parametrize(
    "sharding_type, shards",
    [
        ("grid_shard", [(0, 0, 100, 0, 16)]),  # a TorchRec type distrec has no equivalent of
        ("table_row_wise", [(0, 0, 50, 0, 8), (1, 50, 50, 8, 8)]),  # row shards that split columns too
        ("column_wise", [(0, 0, 60, 0, 16), (1, 60, 40, 0, 16)]),  # "column" shards that split rows
        ("table_wise", []),
    ],
)
def test_layouts_distrec_cannot_run_are_one_line_errors(sharding_type, shards):
    with pytest.raises(DistrecError, match=f"{FIX}$") as raised:
        placement_from_shards("t", sharding_type, shards, FIX)
    assert "\n" not in str(raised.value) and "'t'" in str(raised.value)


def distrec_plan() -> tuple[ShardingPlan, list[TableConfig]]:
    """A 2-rank plan with every sharding type, uneven column shards among them."""
    tables = [TableConfig("a", 100, 16), TableConfig("b", 60, 8), TableConfig("c", 80, 12), TableConfig("d", 50, 4)]
    plan = ShardingPlan(
        2,
        [
            TablePlacement("a", "column_wise", [Shard(1, 0, 100, 8, 16), Shard(0, 0, 100, 0, 4), Shard(1, 0, 100, 4, 8)]),
            TablePlacement("b", "table_wise", [Shard(1, 0, 60, 0, 8)]),
            TablePlacement("c", "row_wise", [Shard(0, 0, 40, 0, 12), Shard(1, 40, 80, 0, 12)]),
            TablePlacement("d", "data_parallel", [Shard(0, 0, 50, 0, 4), Shard(1, 0, 50, 0, 4)]),
        ],
    )
    plan.validate(tables)
    return plan, tables


def test_distrec_plan_as_torchrec_parameter_shardings():
    plan, _ = distrec_plan()
    document = torchrec_dict_from_plan(plan.to_dict(), module="model.ebc")
    assert document["world_size"] == 2 and list(document["plan"]) == ["model.ebc"] and document["shapes"] == {"d": [50, 4]}
    a = document["plan"]["model.ebc"]["a"]
    assert a["sharding_type"] == "column_wise" and a["compute_kernel"] == "fused" and a["ranks"] == [0, 1, 1]  # by column offset
    assert a["sharding_spec"][2] == {"shard_offsets": [0, 8], "shard_sizes": [100, 8], "placement": "rank:1/cpu"}
    assert document["plan"]["model.ebc"]["d"] == {"sharding_type": "data_parallel", "compute_kernel": "dense", "ranks": [0, 1], "sharding_spec": None}
    on_gpus = torchrec_dict_from_plan(plan.to_dict(), device="cuda")["plan"]["sparse_arch.embedding_bag_collection"]["b"]
    assert on_gpus["sharding_spec"][0]["placement"] == "rank:1/cuda:1"


def test_distrec_plan_survives_the_round_trip_through_torchrec_json(tmp_path):
    plan, tables = distrec_plan()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(torchrec_dict_from_plan(plan.to_dict())))
    loaded = ShardingPlan.load(path)
    loaded.validate(tables)
    by_table = {p.table: p for p in plan.tables}
    for p in loaded.tables:
        assert p.sharding == by_table[p.table].sharding and set(p.shards) == set(by_table[p.table].shards)


def test_distrec_plans_still_load_as_before(tmp_path):
    plan, _ = distrec_plan()
    plan.save(tmp_path / "plan.json")
    assert not is_torchrec_plan(json.loads((tmp_path / "plan.json").read_text()))
    assert ShardingPlan.load(tmp_path / "plan.json").to_dict() == plan.to_dict()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("world_size"), r"TorchRec plan is malformed \(KeyError"),
        (lambda d: d.update(shapes={}), "replicates table 'd' but gives no shape for it"),
        (lambda d: d["plan"]["sparse_arch.embedding_bag_collection"]["a"]["ranks"].pop(), r"malformed \(ValueError"),
        (lambda d: d["plan"].update(other={"b": d["plan"]["sparse_arch.embedding_bag_collection"]["b"]}), r"places a table name in two modules \(\['b'\]\)"),
    ],
)
def test_a_broken_torchrec_plan_is_a_one_line_error_naming_the_snippet(tmp_path, edit, message):
    document = torchrec_dict_from_plan(distrec_plan()[0].to_dict())
    edit(document)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    with pytest.raises(DistrecError, match=message) as raised:
        ShardingPlan.load(path)
    assert "\n" not in str(raised.value) and str(raised.value).endswith("docs/neuroshard-vs-torchrec.md")


def test_a_torchrec_plan_for_other_tables_fails_validation():
    plan = ShardingPlan.from_dict(distrec_plan_dict(torchrec_dict_from_plan(distrec_plan()[0].to_dict())))
    with pytest.raises(DistrecError, match="table .a. .column_wise. is invalid: its columns ranges end at 16, not 32"):
        plan.validate([TableConfig("a", 100, 32), TableConfig("b", 60, 8), TableConfig("c", 80, 12), TableConfig("d", 50, 4)])


def train_dmp_on_rank(rank: int, world_size: int, document: dict, tables: list[tuple[str, int, int]], steps: int) -> dict:
    """``steps`` SGD steps of TorchRec's DistributedModelParallel (an EmbeddingBagCollection
    under "ebc" and a linear head) on the plan ``document``; this rank's losses, its local
    shard shapes per table before and after, and whether its embedding weights moved."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    from distrec.parallel.torchrec_format import torchrec_sharding_plan

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            configs = [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[n]) for n, r, d in tables]
            self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
            self.head = torch.nn.Linear(sum(d for _, _, d in tables), 1)

        def forward(self, features):
            return self.head(self.ebc(features).values())

    torch.manual_seed(0)
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.5})
    model = DistributedModelParallel(Model(), device=torch.device("cpu"), plan=torchrec_sharding_plan(document), sharders=[sharder])
    dense = torch.optim.SGD(model.parameters(), lr=0.1)

    def local_weights() -> dict[str, list[torch.Tensor]]:
        out = {}
        for key, value in model.state_dict().items():
            name = key.split(".")[-2]
            if key.startswith("ebc."):
                out[name] = [s.tensor.clone() for s in value.local_shards()] if hasattr(value, "local_shards") else [value.clone()]
        return out

    before = local_weights()
    generator = torch.Generator().manual_seed(rank)
    batch, losses = 16, []
    for _ in range(steps):
        lengths = torch.randint(1, 4, (len(tables) * batch,), generator=generator)
        values = torch.cat([torch.randint(0, r, (int(lengths[i * batch : (i + 1) * batch].sum()),), generator=generator) for i, (_, r, _) in enumerate(tables)])
        loss = (model(KeyedJaggedTensor(keys=[n for n, _, _ in tables], values=values, lengths=lengths)) - 1).pow(2).mean()
        loss.backward()
        dense.step()
        dense.zero_grad()
        losses.append(float(loss.detach()))
    after = local_weights()
    return {
        "losses": losses,
        "shapes": {n: sorted(list(w.shape) for w in ws) for n, ws in after.items() if ws},
        "moved": {n: any(not torch.equal(a, b) for a, b in zip(before[n], after[n])) for n in after if after[n]},
    }


@pytest.mark.skipif(not torchrec_available(), reason="TorchRec is not installed (benchmarks/setup_torchrec.sh)")
def test_torchrec_distributed_model_parallel_trains_on_a_distrec_plan(tmp_path):
    plan, tables = distrec_plan()
    plan = ShardingPlan(2, [p for p in plan.tables if p.sharding != "row_wise"])  # TorchRec shards row-wise only on GPUs
    tables = [(t.name, t.num_rows, t.dim) for t in tables if t.name != "c"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(torchrec_dict_from_plan(plan.to_dict(), module="ebc")))  # what distrec plan --format torchrec writes
    ranks = run_distributed(train_dmp_on_rank, 2, json.loads(path.read_text()), tables, 4)
    for rank, result in enumerate(ranks):
        mine = {p.table: sorted([s.row_end - s.row_start, s.col_end - s.col_start] for s in p.shards if s.rank == rank) for p in plan.tables}
        assert result["shapes"] == {n: shapes for n, shapes in mine.items() if shapes}  # DMP holds exactly the plan's shards
        assert all(result["moved"].values()) and len(result["losses"]) == 4
        assert all(loss == loss and loss < 1e3 for loss in result["losses"])  # finite


def test_distrec_trains_on_a_plan_torchrecs_planner_made(tmp_path):
    plan = ShardingPlan.load(TORCHREC_PLAN)
    assert {p.table: p.sharding for p in plan.tables} == {
        "C1": "table_wise",
        "C2": "column_wise",
        "C3": "data_parallel",
        "C4": "data_parallel",
        "C5": "table_wise",
    }
    steps, cache = 4, tmp_path / "cache"
    prepare(tiny_config(cache, steps).data, progress=False)
    run_distributed(train_on_rank, 2, tiny_config(cache, steps, plan=str(TORCHREC_PLAN)), tmp_path / "run")
    train(tiny_config(cache, steps), tmp_path / "single", progress=False)
    assert train_losses(tmp_path / "run") == pytest.approx(train_losses(tmp_path / "single"), abs=1e-5)  # SGD: sharding keeps the maths
    assert ShardingPlan.load(tmp_path / "run" / "plan.json").to_dict() == plan.to_dict()
