"""2D sparse parallelism on real gloo groups: exact sync equals one process, periodic sync
with K = 1 equals exact, and checkpoints hold one copy of the tables and reshard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from distrec.data import Dataset, prepare
from distrec.errors import DistrecError
from distrec.kernels import kernels_enabled
from distrec.models.embedding import row_update_in_backward, update_rows_in_backward
from distrec.modes import select_mode
from distrec.parallel.default_plans import uniform_plan
from distrec.parallel.plan import ShardingPlan
from distrec.parallel.two_d import TouchLog, merge_touched_rows, replica_average, replica_layout
from distrec.tower_partition import TowerPartition
from distrec.train.loop import Trainer, train
from multiprocess import run_distributed
from tiny_runs import assert_same_parameters, tiny_config, train_losses, train_on_rank, trained_parameters

STEPS = 6


def _cfg(cache: Path, steps: int = STEPS, overrides: tuple[str, ...] = (), **parallel):
    return tiny_config(cache, steps, overrides, **parallel)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cache")
    prepare(_cfg(path).data, progress=False)
    return path


def _one_process_run(tmp_path_factory, name: str, cfg) -> Path:
    out = tmp_path_factory.mktemp(name)
    train(cfg, out, progress=False)
    return out


@pytest.fixture(scope="module")
def reference(cache, tmp_path_factory) -> Path:
    return _one_process_run(tmp_path_factory, "single", _cfg(cache, steps=2 * STEPS))


@pytest.fixture(scope="module")
def reference_half(cache, tmp_path_factory) -> Path:
    return _one_process_run(tmp_path_factory, "single-half", _cfg(cache))


def test_replica_layout_groups_consecutive_ranks():
    groups, sets = replica_layout(8, 2)
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sets == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("world_size, groups, message", [(4, 3, "must divide"), (1, 2, "must divide")])
def test_groups_must_divide_the_world(cache, world_size, groups, message):
    with pytest.raises(DistrecError, match=message):
        select_mode(_cfg(cache, replica_groups=groups), world_size)


def test_plan_for_the_wrong_group_size_is_refused(cache, tmp_path):
    tables = Dataset(prepare(_cfg(cache).data, progress=False)).tables(8)
    uniform_plan(tables, 4, "table_wise").save(tmp_path / "plan4.json")
    cfg = _cfg(cache, replica_groups=2, plan=str(tmp_path / "plan4.json"))
    with pytest.raises(DistrecError, match="is for 4 ranks but 2 are running"):
        select_mode(cfg, 4).check(cfg, 4, tables)


def _merge_on_rank(rank: int, world_size: int, touches: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Replicas that agree (zeros) take ``len(touches[rank])`` steps: each adds r + 1 to the
    weights of the rows it touches and sets their state to 10 (r + 1); then they merge."""
    weights, state, log = torch.zeros(4, 2), torch.zeros(4), TouchLog()
    for rows in touches[rank]:
        log.steps += 1
        log.record(weights, torch.tensor(rows))
        weights[rows] += rank + 1.0
        state[rows] = 10.0 * (rank + 1)
    sent = merge_touched_rows(weights, [state], log.take(weights), log.steps, None)
    return weights, state, sent


def test_merging_after_one_step_averages_each_row_over_the_groups_that_touched_it():
    for weights, state, sent in run_distributed(_merge_on_rank, 2, [[[0, 1]], [[1, 2]]]):
        # row 0: rank 0's alone, row 1: the mean of both, row 2: rank 1's alone, row 3: untouched
        assert weights[:, 0].tolist() == pytest.approx([1.0, 1.5, 2.0, 0.0]) and torch.equal(weights[:, 0], weights[:, 1])
        assert state.tolist() == [10.0, 15.0, 20.0, 0.0]
        assert sent == 8 + 2 * 8 + 2 * (2 + 1 + 1) * 4  # only its 2 touched rows: their count, ids, then change, touch count, state


def test_merging_scales_the_changes_to_the_steps_one_run_would_take():
    # 2 steps: rank 0 touches row 0 at both (+1 each), rank 1 row 0 once (+2) and row 1 once (+2)
    for weights, _, _ in run_distributed(_merge_on_rank, 2, [[[0], [0]], [[0], [1]]]):
        # row 0 was touched at every step: 2 steps' worth of the 3 steps' changes, (1 + 1 + 2) x 2/3;
        # row 1 by one group at one of the steps: that group's change, whole
        assert weights[:2, 0].tolist() == pytest.approx([8 / 3, 2.0], rel=1e-5)


def test_touch_log_records_rows_stepped_in_backward_before_their_update():
    weight, other = nn.Parameter(torch.arange(8.0).view(4, 2)), nn.Parameter(torch.zeros(3, 2))
    start = weight.detach().clone()

    def step(rows, bounds, picks, grad):
        weight.data[rows] -= 1

    update_rows_in_backward(weight, step)
    log = TouchLog()
    unwatched = log.watch_updates([weight, other])
    assert len(unwatched) == 1 and unwatched[0] is other  # no update in backward: its gradients are logged
    update = row_update_in_backward(weight)
    for rows in ([1, 3], [3]):
        update(torch.tensor(rows), torch.tensor([0, 1]), torch.tensor([0]), torch.zeros(1, 2))
    counts, rows, origins = log.take(weight)
    assert counts.tolist() == [0, 1, 0, 2]
    assert rows.tolist() == [1, 3] and torch.equal(origins, start[[1, 3]])  # as before the first update
    assert torch.equal(weight.data[[1, 3]], start[[1, 3]] - torch.tensor([[1.0], [2.0]]))  # and the updates ran


def _train_reporting_updates_in_backward(rank: int, world_size: int, cfg, out: Path) -> bool:
    """Train; whether every table parameter of this rank was stepped in backward."""
    trainer = Trainer(cfg, out, progress=False)
    try:
        stepped = all(row_update_in_backward(p) is not None for p in trainer.model.sparse_parameters())
        trainer.fit()
    finally:
        trainer.close()
    return stepped


@pytest.mark.skipif(not kernels_enabled(), reason="the update in backward is the compiled kernels' (DISTREC_KERNELS=torch turns it off)")
def test_touched_merge_keeps_the_update_in_backward_and_equals_the_gradient_path(cache, tmp_path):
    """Periodic 2D with row-wise Adagrad (``touched`` merges): the tables are stepped in backward,
    their rows logged from the updates, and training equals the run whose rows are logged from
    gradients (a weight decay of 1e-12 turns the in-backward update off and changes nothing at 1e-5)."""

    def cfg(decay: float):
        c = _cfg(cache, replica_groups=2, sharding="row_wise", replica_sync="periodic", sync_every=3)
        c.train.embedding_optimizer, c.train.embedding_lr, c.train.embedding_weight_decay = "adagrad", 0.3, decay
        return c

    fused = run_distributed(_train_reporting_updates_in_backward, 4, cfg(0.0), tmp_path / "fused")
    from_gradients = run_distributed(_train_reporting_updates_in_backward, 4, cfg(1e-12), tmp_path / "gradients")
    assert fused == [True] * 4 and from_gradients == [False] * 4
    assert json.loads((tmp_path / "fused" / "summary.json").read_text())["replica_average"] == "touched"
    assert train_losses(tmp_path / "fused") == pytest.approx(train_losses(tmp_path / "gradients"), abs=1e-5)
    assert_same_parameters(trained_parameters(tmp_path / "fused"), trained_parameters(tmp_path / "gradients"))


@pytest.mark.parametrize(
    "optimizer, chosen, resolved",
    [("sgd", "auto", "all"), ("adagrad", "auto", "touched"), ("adam", "auto", "touched"), ("adam", "all", "all"), ("sgd", "touched", "touched")],
)
def test_replica_average_follows_the_embedding_optimizer(cache, optimizer, chosen, resolved):
    cfg = _cfg(cache, replica_groups=2, replica_sync="periodic", replica_average=chosen)
    cfg.train.embedding_optimizer = optimizer
    assert replica_average(cfg) == resolved


def test_replica_average_needs_periodic_sync(cache):
    with pytest.raises(DistrecError, match="add --replica-sync periodic"):
        select_mode(_cfg(cache, replica_groups=2, replica_sync="exact", replica_average="touched"), 4)


def _mixed_plan(cache: Path, path: Path) -> Path:
    tables = Dataset(prepare(_cfg(cache).data, progress=False)).tables(8)
    kinds = ["table_wise", "column_wise", "row_wise", "data_parallel", "table_wise"]
    ShardingPlan(2, [uniform_plan([t], 2, kind).tables[0] for t, kind in zip(tables, kinds)]).save(path)
    return path


@pytest.mark.parametrize("plan", ["column_wise", "mixed"])
def test_exact_2d_equals_one_process(cache, reference_half, tmp_path, plan):
    """2 groups x 2 ranks, every sharding type within a group."""
    parallel = {"plan": str(_mixed_plan(cache, tmp_path / "plan.json"))} if plan == "mixed" else {"sharding": plan}
    run_distributed(train_on_rank, 4, _cfg(cache, replica_groups=2, **parallel), tmp_path / "run")
    assert train_losses(tmp_path / "run") == pytest.approx(train_losses(reference_half), abs=1e-5)
    assert_same_parameters(trained_parameters(tmp_path / "run"), trained_parameters(reference_half))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["replica_groups"] == 2 and summary["replica_sync"] == "exact" and summary["replica_sync_bytes"] > 0
    meta = json.loads((tmp_path / "run" / "checkpoint" / "meta.json").read_text())
    assert {entry["rank"] for entry in meta["blocks"]} == {0, 1}  # one copy of the tables: group 0's
    assert _replica_sync_per_step(tmp_path / "run") == (pytest.approx(summary["replica_sync_bytes"] / STEPS), True)


def _replica_sync_per_step(run: Path) -> tuple[float, bool]:
    """The replica sync's bytes per step in a run's breakdown, and whether it took any time;
    checks the all-to-alls and the dense all-reduce are there beside it."""
    breakdown = json.loads((run / "breakdown.json").read_text())
    sent = breakdown["bytes_per_step"]
    assert sent["input_all_to_all"] > 0 and sent["output_all_to_all"] > 0 and sent["gradient_all_reduce"] > 0
    return sent["replica_sync"], breakdown["components"]["replica_sync"]["mean_ms"] > 0


def test_periodic_sync_every_step_equals_exact(cache, reference_half, tmp_path):
    run_distributed(train_on_rank, 4, _cfg(cache, replica_groups=2, sharding="row_wise", replica_sync="periodic", sync_every=1), tmp_path / "run")
    assert train_losses(tmp_path / "run") == pytest.approx(train_losses(reference_half), abs=1e-5)
    assert_same_parameters(trained_parameters(tmp_path / "run"), trained_parameters(reference_half))


def test_periodic_sync_lets_replicas_drift_between_syncs(cache, reference_half, tmp_path):
    run_distributed(train_on_rank, 4, _cfg(cache, replica_groups=2, sharding="row_wise", replica_sync="periodic", sync_every=3), tmp_path / "run")
    losses = train_losses(tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # syncs at steps 3 and 6, and none before the checkpoint: the replicas were averaged at step 6
    assert _replica_sync_per_step(tmp_path / "run") == (pytest.approx(summary["replica_sync_bytes"] / STEPS), True)
    assert losses[:1] == pytest.approx(train_losses(reference_half)[:1], abs=1e-5)  # the same start
    assert losses != pytest.approx(train_losses(reference_half), abs=1e-5)


def test_checkpoints_reshard_between_2d_sharded_and_one_process(cache, reference, tmp_path):
    """(2 x 2) for half the steps, then (1 x 4) plain sharding; and (1 x 4) -> (2 x 2) -> one process."""
    first = tmp_path / "first"
    run_distributed(train_on_rank, 4, _cfg(cache, replica_groups=2, sharding="table_wise"), first)
    run_distributed(train_on_rank, 4, _cfg(cache, steps=2 * STEPS, sharding="row_wise"), first, True)
    assert train_losses(first) == pytest.approx(train_losses(reference), abs=1e-5)
    assert_same_parameters(trained_parameters(first), trained_parameters(reference))

    second = tmp_path / "second"
    run_distributed(train_on_rank, 4, _cfg(cache, sharding="column_wise"), second)
    assert _replica_sync_per_step(second) == (0, False)
    run_distributed(train_on_rank, 4, _cfg(cache, steps=2 * STEPS, replica_groups=2, sharding="row_wise"), second, True)
    assert train_losses(second) == pytest.approx(train_losses(reference), abs=1e-5)
    assert_same_parameters(trained_parameters(second), trained_parameters(reference))


TOWERS = [["C4", "C1", "C3"], ["C2", "C5"]]


def _dmt_cfg(cache: Path, steps: int = STEPS, module: str | None = "dlrm", **parallel):
    """The tiny run with two towers (DMT's tower modules ``module``, or none)."""
    towers = cache / "towers.json"
    if not towers.exists():
        TowerPartition(TOWERS, "coherent", 1.5).save(towers)
    cfg = _cfg(cache, steps, towers=str(towers), **parallel)
    cfg.model.tower_module = module
    return cfg


@pytest.fixture(scope="module")
def dmt_reference(cache, tmp_path_factory) -> Path:
    return _one_process_run(tmp_path_factory, "single-dmt", _dmt_cfg(cache, steps=2 * STEPS))


@pytest.fixture(scope="module")
def dmt_reference_half(cache, tmp_path_factory) -> Path:
    return _one_process_run(tmp_path_factory, "single-dmt-half", _dmt_cfg(cache))


def test_sptt_groups_need_whole_hosts(cache):
    tables = Dataset(prepare(_cfg(cache).data, progress=False)).tables(8)
    cfg = _dmt_cfg(cache, replica_groups=2, lookup="sptt", hosts=3, ranks_per_host=2)
    with pytest.raises(DistrecError, match="must divide the 3 hosts"):
        select_mode(cfg, 6).check(cfg, 6, tables)


@pytest.mark.slow  # about 90 s on 2 cores: 8 processes, then 4
def test_exact_2d_with_sptt_and_tower_modules_equals_one_process_and_reshards(cache, dmt_reference, dmt_reference_half, tmp_path):
    """2 groups x 2 hosts x 2 ranks, SPTT and DMT's tower modules inside each group, gathered
    into one process; then resumed as plain SPTT on 2 hosts x 2 ranks."""
    run = tmp_path / "run"
    run_distributed(train_on_rank, 8, _dmt_cfg(cache, replica_groups=2, lookup="sptt", hosts=4, ranks_per_host=2), run)
    assert train_losses(run) == pytest.approx(train_losses(dmt_reference_half), abs=1e-5)
    assert_same_parameters(trained_parameters(run), trained_parameters(dmt_reference_half))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replica_groups"] == 2 and summary["replica_sync_bytes"] > 0 and summary["dmt"]["compression"] > 1
    plan = json.loads((run / "plan.json").read_text())
    owner = {p["table"]: p["shards"][0]["rank"] for p in plan["tables"]}
    assert {owner["C4"], owner["C1"], owner["C3"]} <= {0, 1} and {owner["C2"], owner["C5"]} <= {2, 3}  # tower t on host t of a group
    meta = json.loads((run / "checkpoint" / "meta.json").read_text())
    assert {entry["rank"] for entry in meta["blocks"]} == {0, 1, 2, 3} and meta["towers"]["rank"] == [0, 2]  # group 0's copy
    run_distributed(train_on_rank, 4, _dmt_cfg(cache, steps=2 * STEPS, lookup="sptt", hosts=2, ranks_per_host=2), run, True)
    assert train_losses(run) == pytest.approx(train_losses(dmt_reference), abs=1e-5)
    assert_same_parameters(trained_parameters(run), trained_parameters(dmt_reference))


@pytest.mark.slow  # about 60 s on 2 cores: 8 processes
def test_periodic_2d_with_sptt_syncing_every_step_equals_one_process(cache, reference_half, tmp_path):
    """SPTT without tower modules inside 2 groups of 2 hosts x 2 ranks; with SGD, periodic sync every step is exact."""
    cfg = _dmt_cfg(cache, module=None, replica_groups=2, lookup="sptt", hosts=4, ranks_per_host=2, replica_sync="periodic", sync_every=1)
    run_distributed(train_on_rank, 8, cfg, tmp_path / "run")
    assert train_losses(tmp_path / "run") == pytest.approx(train_losses(reference_half), abs=1e-5)
    assert_same_parameters(trained_parameters(tmp_path / "run"), trained_parameters(reference_half))
    assert _replica_sync_per_step(tmp_path / "run")[1]


@pytest.mark.slow  # about 2-5 min on 2 busy cores: three runs of 8 processes
def test_periodic_2d_with_sptt_and_tower_modules_resumes_exactly(cache, tmp_path):
    """2 groups x 2 hosts x 2 ranks, SPTT and tower modules in each group, replicas (weights and
    row-wise Adagrad state) averaged every 3 steps: 6 steps, a checkpoint (at a sync), then 6
    more equal 12 steps in one go."""

    def cfg(steps: int):
        c = _dmt_cfg(cache, steps, replica_groups=2, lookup="sptt", hosts=4, ranks_per_host=2, replica_sync="periodic", sync_every=3)
        c.train.embedding_optimizer, c.train.embedding_lr = "adagrad", 0.3
        return c

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run_distributed(train_on_rank, 8, cfg(2 * STEPS), whole)
    run_distributed(train_on_rank, 8, cfg(STEPS), resumed)
    run_distributed(train_on_rank, 8, cfg(2 * STEPS), resumed, True)
    assert train_losses(resumed) == pytest.approx(train_losses(whole), abs=1e-5)
    assert_same_parameters(trained_parameters(resumed), trained_parameters(whole))
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["replica_sync"] == "periodic" and summary["replica_sync_bytes"] > 0 and summary["dmt"]["compression"] > 1


def test_periodic_2d_reports_the_metrics_of_the_model_it_saves(cache, tmp_path):
    """Checkpoints and evaluations between periodic syncs: the replicas are averaged before
    each, so the summary's metrics are those of the saved model."""
    from distrec.train.evaluate import evaluate_checkpoint

    cfg = _cfg(cache, replica_groups=2, sharding="row_wise", replica_sync="periodic", sync_every=4)
    cfg.train.checkpoint_every, cfg.train.eval_every = 3, 5
    run_distributed(train_on_rank, 4, cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    scored = evaluate_checkpoint(tmp_path / "run", None, None, progress=False)
    assert scored["auc"] == pytest.approx(summary["auc"], abs=1e-6) and scored["logloss"] == pytest.approx(summary["logloss"], abs=1e-6)
