"""Distributed Hotline equals the ordinary sharded trainer and loses no update when rows move.

Real gloo process groups. The reference is the sharded trainer (DDP for the dense layers,
every lookup through the all-to-all) on the same batches and plan; Hotline replicates the
hot rows, runs popular micro-batches without any all-to-all and re-learns the hot set every
few steps, so rows move between the shards and the hot table mid-run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distrec import config
from distrec.components.optim import RowWiseAdagrad
from distrec.data import Dataset, prepare
from distrec.hotline.distributed import replicated_hot_embeddings
from distrec.hotline.replicated import ReplicatedHotEmbedding
from distrec.models.build import build_model
from distrec.parallel.default_plans import uniform_plan
from distrec.parallel.plan import ShardingPlan
from distrec.parallel.reshard import held_blocks
from distrec.train.evaluate import load_trained_model
from multiprocess import run_distributed
from tiny_runs import tiny_config, train_on_rank

STEPS = 9
HOTLINE = ["hotline.enabled=true", "hotline.sample_rate=1.0", "hotline.relearn_every=3", "hotline.hot_budget=8KB"]


def _cfg(cache: Path, hotline: bool, optimizer: str = "sgd", **parallel: str) -> config.RunConfig:
    return tiny_config(cache, STEPS, (f"train.optimizer={optimizer}", *(HOTLINE if hotline else [])), **parallel)


def _parameters(run: Path) -> dict[str, torch.Tensor]:
    model, *_ = load_trained_model(run, torch.device("cpu"))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _mixed_plan(cache: Path, world_size: int, path: Path) -> Path:
    tables = Dataset(prepare(_cfg(cache, False).data, progress=False)).tables(8)
    kinds = ["table_wise", "column_wise", "row_wise", "data_parallel", "table_wise"]
    placements = [uniform_plan([t], world_size, kind).tables[0] for t, kind in zip(tables, kinds)]
    ShardingPlan(world_size, placements).save(path)
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cache")
    prepare(_cfg(path, False).data, progress=False)
    return path


def _train_both(cache: Path, tmp_path: Path, world_size: int, optimizer: str, **parallel: str) -> dict:
    runs = {}
    for hotline in (False, True):
        out = tmp_path / ("hotline" if hotline else "sharded")
        run_distributed(train_on_rank, world_size, _cfg(cache, hotline, optimizer, **parallel), out)
        runs[hotline] = out
    a, b = _parameters(runs[False]), _parameters(runs[True])
    assert a.keys() == b.keys()
    # Equal up to float32 rounding: the micro-batches sum the dense gradients in another order,
    # and Adagrad's normalised steps carry such differences of a few ulps into every weight
    # (1e-5 of a weight is about 80 ulps; a lost or misplaced update moves it by about lr).
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    return json.loads((runs[True] / "summary.json").read_text())


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_two_ranks_equal_the_sharded_trainer(cache, tmp_path, optimizer):
    summary = _train_both(cache, tmp_path, 2, optimizer, sharding="table_wise")
    hot = summary["hotline"]
    assert hot["relearns"] == 2  # rows moved twice mid-run (steps 3 and 6)
    assert hot["hot_rows"] > 0 and 0 < hot["popular_fraction"] < 1
    reduced = {run: json.loads((tmp_path / run / "breakdown.json").read_text())["bytes_per_step"]["gradient_all_reduce"] for run in ("sharded", "hotline")}
    assert reduced["hotline"] > reduced["sharded"]  # Hotline's all-reduce adds the touched hot rows to the dense gradients


def test_four_ranks_with_every_sharding_type_equal_the_sharded_trainer(cache, tmp_path):
    plan = _mixed_plan(cache, 4, tmp_path / "plan.json")
    summary = _train_both(cache, tmp_path, 4, "sgd", plan=str(plan))
    assert summary["hotline"]["relearns"] == 2 and summary["hotline"]["popular_fraction"] > 0


SKEWED = ("data.synthetic.zipf_exponents=[8,0,8,0,8]",)  # features 0, 2 and 4 look up almost only row 1


def _train_counting_cold_features(rank: int, world_size: int, cfg: config.RunConfig, out: Path) -> list[int]:
    """``train_on_rank``, recording how many features each step's cold exchange carried."""
    carried = []
    cold_features = ReplicatedHotEmbedding._cold_features

    def counted(self) -> list[int] | None:
        features = cold_features(self)
        carried.append(len(self.tables) if features is None else len(features))
        return features

    ReplicatedHotEmbedding._cold_features = counted
    train_on_rank(rank, world_size, cfg, out)
    return carried


def test_features_without_cold_lookups_stay_out_of_the_exchange(tmp_path):
    """With three features whose lookups are all hot after the first re-learning, the cold
    exchange leaves them out, and training still equals the sharded trainer's."""
    cache = tmp_path / "cache"
    prepare(tiny_config(cache, STEPS, SKEWED).data, progress=False)
    plan = _mixed_plan(cache, 4, tmp_path / "plan.json")
    runs = {}
    for hotline in (False, True):
        runs[hotline] = tmp_path / str(hotline)
        cfg = tiny_config(cache, STEPS, ("train.optimizer=sgd", *SKEWED, *(HOTLINE if hotline else [])), plan=str(plan))
        carried = run_distributed(_train_counting_cold_features, 4, cfg, runs[hotline])
    for per_rank in carried:
        assert per_rank[:3] == [5, 5, 5] and min(per_rank[3:]) < 5  # all cold before the first re-learning
    a, b = _parameters(runs[False]), _parameters(runs[True])
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def _round_trip(rank: int, world_size: int, cache: Path, plan_path: Path) -> None:
    cfg = _cfg(cache, True, "adagrad")
    tables = Dataset(prepare(cfg.data, progress=False)).tables(cfg.model.embedding_dim)
    torch.manual_seed(0)  # the same initial tables on every rank
    model = build_model(cfg.model, 13, tables, device="cpu")
    emb = replicated_hot_embeddings(model, tables, ShardingPlan.load(plan_path), torch.device("cpu"))
    opt = RowWiseAdagrad(list(emb.parameters()), lr=0.1)
    for p in emb.cold.parameters():  # a distinct accumulator per row, the same on every replica
        opt.state[p]["sum"] = p.detach().abs().sum(1)
    blocks = held_blocks(emb.cold)
    weights = [b.rows(b.param.detach()).clone() for b in blocks]
    sums = [b.rows(opt.state[b.param]["sum"]).clone() for b in blocks]
    total = emb.space.total_rows
    full = torch.cat([model.embeddings.table_weight(t.name).detach() for t in tables])
    emb.set_hot_ids(torch.arange(0, total, 3), opt)
    torch.testing.assert_close(emb.hot_weight.detach(), full[::3], rtol=0, atol=0)
    second = torch.arange(1, total, 2)  # some rows stay, some leave, some enter
    emb.set_hot_ids(second, opt)
    torch.testing.assert_close(emb.hot_weight.detach(), full[1::2], rtol=0, atol=0)
    emb.hot_weight.data += 1.0  # an update that exists only in the hot table
    opt.state[emb.hot_weight]["sum"] += 1.0
    emb.set_hot_ids(second[:0], opt)
    offsets = {t.name: int(emb.space.offsets[i]) for i, t in enumerate(tables)}
    for b, w, s in zip(blocks, weights, sums):
        ids = offsets[b.block.table] + b.block.row_start + torch.arange(w.shape[0])
        moved = (ids % 2 == 1).float()
        torch.testing.assert_close(b.rows(b.param.detach()), w + moved.unsqueeze(1), rtol=0, atol=0)
        torch.testing.assert_close(b.rows(opt.state[b.param]["sum"]), s + moved, rtol=0, atol=0)


def test_rows_moving_between_shards_and_hot_table_lose_no_update(cache, tmp_path):
    tables = Dataset(prepare(_cfg(cache, False).data, progress=False)).tables(8)
    kinds = ["table_wise", "row_wise", "data_parallel", "row_wise", "table_wise"]
    plan = ShardingPlan(2, [uniform_plan([t], 2, kind).tables[0] for t, kind in zip(tables, kinds)])
    plan.save(tmp_path / "plan.json")
    run_distributed(_round_trip, 2, cache, tmp_path / "plan.json")


def test_resumed_run_equals_the_run_left_alone(cache, tmp_path):
    """A checkpoint holds every row in its owner's shard (hot rows written back) and the hot
    set, which is read back on resume; the continued run equals the uninterrupted one. The
    hot-lookup fractions it logs go on from the checkpoint's counters (the logger's window
    restarts, so the later hot sets may differ from the uninterrupted run's)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    cfg = _cfg(cache, True, "adagrad", sharding="row_wise")
    cfg.train.log_every = 3
    run_distributed(train_on_rank, 2, cfg, straight)
    half = _cfg(cache, True, "adagrad", sharding="row_wise")
    half.train.max_steps = 5
    half.train.log_every = 3
    run_distributed(train_on_rank, 2, half, split)
    run_distributed(train_on_rank, 2, cfg, split, True)
    a, b = _parameters(straight), _parameters(split)
    # Equal up to float32 rounding: the micro-batches sum the dense gradients in another order,
    # and Adagrad's normalised steps carry such differences of a few ulps into every weight
    # (1e-5 of a weight is about 80 ulps; a lost or misplaced update moves it by about lr).
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert json.loads((split / "summary.json").read_text())["hotline"]["relearns"] == 2

    def hot_lookup_fractions(run: Path) -> dict[int, float]:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["hot_lookup_fraction"] for r in records if r["split"] == "train"}

    fractions, uninterrupted = hot_lookup_fractions(split), hot_lookup_fractions(straight)
    assert list(fractions) == [3, 6, 9] and fractions[3] == uninterrupted[3]
    assert fractions[6] > 0 and fractions[9] > 0
