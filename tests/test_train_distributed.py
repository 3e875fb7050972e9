"""The distributed trainer equals the single-process one, resumes, reshards and survives a killed rank.

Every multi-process test uses real gloo process groups; the reference is the ordinary
single-process trainer on the same global batches (SGD, so that sharding cannot change the
maths), compared per step (training loss) and at the end (every parameter, within 1e-5).
Runs are kept short: sharded sums add in another order, and over hundreds of steps a
pre-activation within 1e-7 of a ReLU's kink eventually flips, after which single-process and
sharded runs differ by more than rounding (measured: first at step 150 of this set-up). A
resumed or restarted run is compared with the same run left alone, which it equals exactly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from distrec.cli import main
from distrec.data import Dataset, prepare
from distrec.models.dlrm import DLRM
from distrec.parallel.default_plans import uniform_plan
from distrec.parallel.parallelize import dense_data_parallel
from distrec.parallel.plan import ShardingPlan
from distrec.tables import TableConfig
from distrec.train.loop import Trainer, train
from launched import workers_of
from multiprocess import run_distributed
from tiny_runs import TINY_DATA, assert_same_parameters, tiny_config, train_losses, train_on_rank, trained_parameters

STEPS = 9  # 16 steps make an epoch of 1080 training rows, so two runs of STEPS cross into the next


def _cfg(cache: Path, steps: int = STEPS, **parallel: str):
    return tiny_config(cache, steps, **parallel)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cache")
    prepare(_cfg(path).data, progress=False)
    return path


@pytest.fixture(scope="module")
def reference_half(cache, tmp_path_factory) -> Path:
    """The single-process run of STEPS steps."""
    out = tmp_path_factory.mktemp("single-half")
    train(_cfg(cache), out, progress=False)
    return out


@pytest.fixture(scope="module")
def reference(cache, tmp_path_factory) -> Path:
    """The single-process run every distributed run must reproduce (2 epochs' worth of steps)."""
    out = tmp_path_factory.mktemp("single")
    train(_cfg(cache, steps=2 * STEPS), out, progress=False)
    return out


def _mixed_plan(cache: Path, world_size: int, path: Path) -> Path:
    tables = Dataset(prepare(_cfg(cache).data, progress=False)).tables(8)
    kinds = ["table_wise", "column_wise", "row_wise", "data_parallel", "table_wise"]
    placements = [uniform_plan([t], world_size, kind).tables[0] for t, kind in zip(tables, kinds)]
    ShardingPlan(world_size, placements).save(path)
    return path


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("sharding", ["table_wise", "column_wise", "row_wise", "data_parallel", "mixed"])
def test_sharded_training_equals_single_process(cache, reference_half, tmp_path, sharding, world_size):
    if sharding == "mixed":
        cfg = _cfg(cache, plan=str(_mixed_plan(cache, world_size, tmp_path / "plan.json")))
    else:
        cfg = _cfg(cache, sharding=sharding)
    run_distributed(train_on_rank, world_size, cfg, tmp_path / "run")
    assert train_losses(tmp_path / "run") == pytest.approx(train_losses(reference_half), abs=1e-5)
    assert_same_parameters(trained_parameters(tmp_path / "run"), trained_parameters(reference_half))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == world_size and summary["embeddings"] == "sharded"
    assert len(summary["peak_rss_bytes_per_rank"]) == world_size and min(summary["peak_rss_bytes_per_rank"]) > 2**20
    plan = ShardingPlan.load(tmp_path / "run" / "plan.json")
    assert plan.world_size == world_size


def test_resume_and_reshard_continue_the_same_trajectory(cache, reference, tmp_path):
    """2 ranks column-wise for half the steps, then 4 ranks row-wise: the single-process run."""
    out = tmp_path / "run"
    run_distributed(train_on_rank, 2, _cfg(cache, steps=STEPS, sharding="column_wise"), out)
    resumed = _cfg(cache, steps=2 * STEPS, sharding="row_wise")
    run_distributed(train_on_rank, 4, resumed, out, True)
    assert train_losses(out) == pytest.approx(train_losses(reference), abs=1e-5)
    assert_same_parameters(trained_parameters(out), trained_parameters(reference))
    meta = json.loads((out / "checkpoint" / "meta.json").read_text())
    assert meta["world_size"] == 4 and meta["step"] == 2 * STEPS


def test_single_process_checkpoint_reshards_onto_two_ranks(cache, reference, tmp_path):
    out = tmp_path / "run"
    train(_cfg(cache, steps=STEPS), out, progress=False)
    run_distributed(train_on_rank, 2, _cfg(cache, steps=2 * STEPS, sharding="row_wise"), out, True)
    assert_same_parameters(trained_parameters(out), trained_parameters(reference))


def _local_rank_state(rank: int, world_size: int, cfg, out: Path) -> dict:
    trainer = Trainer(cfg, out, progress=False)
    trainer.fit()
    dense = {k: v.clone() for k, v in trainer.model.state_dict().items() if not k.startswith("embeddings.")}
    return {"dense": dense, "tables": trainer.model.embeddings.weight.detach().clone()}


def test_local_embeddings_share_dense_layers_and_diverge_in_tables(cache, tmp_path):
    cfg = _cfg(cache, steps=2 * STEPS, embeddings="local")
    cfg.train.eval_every = STEPS
    states = run_distributed(_local_rank_state, 2, cfg, tmp_path / "run")
    for name, value in states[0]["dense"].items():
        torch.testing.assert_close(value, states[1]["dense"][name], rtol=0, atol=0)
    assert not torch.equal(states[0]["tables"], states[1]["tables"])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    divergence = [r["embedding_divergence"] for r in records if r["split"] == "val"]
    assert len(divergence) == 2 and all(d > 0 for d in divergence)
    expected = ((states[0]["tables"] - states[1]["tables"]) / 2).square().sum().sqrt().item()
    assert divergence[-1] == pytest.approx(expected, rel=1e-4)


def _buffers_ddp_broadcasts(rank: int, world_size: int) -> tuple[list[str], float]:
    model = DLRM(3, [TableConfig("t0", 10, 4), TableConfig("t1", 10, 4)], bottom_mlp=[4], top_mlp=[4])
    model.top.register_buffer("seen", torch.full((1,), float(rank)))  # state: rank 0's is broadcast
    ddp = dense_data_parallel(model, torch.device("cpu"))
    return [name for name, b in model.named_buffers() if any(b is x for x in ddp.modules_buffers)], float(model.top.seen)


def test_dense_data_parallel_broadcasts_state_buffers_not_index_maps():
    """The dot interaction's index maps (non-persistent) are not broadcast at every forward."""
    assert run_distributed(_buffers_ddp_broadcasts, 2) == [(["top.seen"], 0.0)] * 2


def test_breakdown_is_written_and_plotted(cache, tmp_path):
    run_distributed(train_on_rank, 2, _cfg(cache, sharding="row_wise"), tmp_path / "run")
    breakdown = json.loads((tmp_path / "run" / "breakdown.json").read_text())
    components = breakdown["components"]
    for name in ("input_all_to_all", "lookup", "output_all_to_all", "dense_forward", "backward", "gradient_all_reduce", "optimizer"):
        assert components[name]["mean_ms"] > 0, name
    assert breakdown["bytes_per_step"]["output_all_to_all"] > 0
    assert breakdown["bytes_per_step"]["gradient_all_reduce"] > 0
    assert main(["report", str(tmp_path / "run"), "-o", str(tmp_path / "b.png")]) == 0
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_plans_and_world_sizes_are_one_clear_error_before_launch(cache, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "world_size": 2,
                "tables": [{"table": "nope", "sharding": "table_wise", "shards": [{"rank": 0, "row_start": 0, "row_end": 5, "col_start": 0, "col_end": 8}]}],
            }
        )
    )
    common = ["train", "--preset", "tiny", "--cache-dir", str(cache), "--no-progress", "--out", str(tmp_path / "run")]
    common += [arg for item in TINY_DATA for arg in ("--set", item)]
    for extra, message in [
        (["--nproc-per-node", "2", "--plan", str(plan)], "does not match the model's tables"),
        (["--nproc-per-node", "3", "--plan", str(plan)], "is for 2 ranks but 3 are running"),
        (["--nproc-per-node", "0"], "--nproc-per-node is 0"),
        (["--nproc-per-node", "2", "--memory-per-rank", "1KB"], "cannot hold them"),
    ]:
        assert main([*common, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds worker processes through /proc")
def test_killed_rank_is_restarted_from_the_checkpoint_and_finishes_the_same(cache, tmp_path):
    """A worker SIGKILLed mid-run: the launcher restarts the group from the last checkpoint and the
    run ends with the losses and parameters of the same run left alone (bit-for-bit resume)."""
    steps = 200
    command = [
        sys.executable,
        "-m",
        "distrec",
        "train",
        "--preset",
        "tiny",
        "--max-steps",
        str(steps),
        "--no-progress",
        "--cache-dir",
        str(cache),
        "--nproc-per-node",
        "2",
        "--sharding",
        "row_wise",
    ]
    for item in [*TINY_DATA, "train.checkpoint_every=10", "train.log_every=1"]:
        command += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    reference = tmp_path / "reference"
    subprocess.run([*command, "--out", str(reference)], check=True, capture_output=True, env=env, timeout=300)
    out = tmp_path / "run"
    launcher = subprocess.Popen([*command, "--out", str(out), "--max-restarts", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not (out / "checkpoint" / "meta.json").is_file() and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.01)
    victims = workers_of(launcher.pid)
    assert victims, "no worker to kill"
    os.kill(victims[max(victims)], signal.SIGKILL)
    stdout, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, stderr
    restart = [line for line in stderr.splitlines() if "restarting" in line]  # the launcher saw the kill and restarted the group, in one line
    assert len(restart) == 1 and re.fullmatch(r"distrec: rank [01] died \(SIGKILL\); restarting from step \d+ \(restart 1 of 1\)", restart[0]), stderr
    assert json.loads(stdout.strip().splitlines()[-1])["steps"] == steps
    assert train_losses(out) == pytest.approx(train_losses(reference), abs=1e-6)
    assert_same_parameters(trained_parameters(out), trained_parameters(reference))
