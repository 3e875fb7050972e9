"""``distrec predict`` and ``distrec export`` on every checkpoint kind: one process, 2 sharded
processes (``distrec train --nproc-per-node 2``), local embeddings, SPTT with DMT tower modules
on 2 hosts x 2 ranks, 2D replica groups, Hotline's tiers (the disk tier memory-mapped, not
read) and distributed Hotline. The AUC of predict's scores is ``evaluate``'s on the same rows,
and the exported program scores as predict does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from distrec.hotline.row_files import BASE_FILE
from distrec.serving.predict import Predictor
from distrec.tower_partition import TowerPartition
from distrec.train.evaluate import evaluate_checkpoint
from distrec.train.loop import train
from multiprocess import run_distributed
from test_serving import cli, scores_of
from tiny_runs import tiny_cli_flags, tiny_config, train_on_rank

pytestmark = pytest.mark.multiprocess

STEPS = 6
HOTLINE = ("hotline.enabled=true", "hotline.sample_rate=1.0", "hotline.relearn_every=3", "hotline.hot_budget=8KB")
# kind -> (processes, --set items, parallel settings); the sharded run is trained by the command line
KINDS = {
    "one process": (1, (), {}),
    "local embeddings": (2, (), {"embeddings": "local"}),
    "sptt with tower modules": (4, ('model.tower_module="dlrm"', "model.tower_compression=2.0"), {"lookup": "sptt", "hosts": 2, "ranks_per_host": 2}),
    "2d": (4, (), {"replica_groups": 2}),
    "hotline tiers": (1, HOTLINE, {}),
    "distributed hotline": (2, HOTLINE, {}),
}


def train_kind(root: Path, kind: str) -> Path:
    processes, overrides, parallel = KINDS[kind]
    if "hosts" in parallel:
        towers = root / "towers.json"
        TowerPartition([["C4", "C1", "C3"], ["C2", "C5"]], "coherent", 1.5).save(towers)
        parallel = {**parallel, "towers": str(towers)}
    cfg = tiny_config(root / "cache", STEPS, overrides, **parallel)
    out = root / kind.replace(" ", "-")
    if processes == 1:
        train(cfg, out, progress=False)
    else:
        run_distributed(train_on_rank, processes, cfg, out)
    return out


def train_sharded_by_the_command_line(root: Path) -> Path:
    out = root / "sharded"
    argv = ["train", *tiny_cli_flags(600, "--set", "data.synthetic.pooling_factor=2"), "--max-steps", str(STEPS), "--nproc-per-node", "2", "--out", str(out)]
    env = {**os.environ, "DISTREC_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "distrec", *argv], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    return {"2 sharded processes": train_sharded_by_the_command_line(root), **{kind: train_kind(root, kind) for kind in KINDS}}


@pytest.mark.parametrize("kind", ["2 sharded processes", *KINDS])
def test_predict_scores_every_checkpoint_kind_as_evaluate_and_export_does(runs, tmp_path, capsys, kind):
    run = runs[kind]
    predicted = cli(capsys, "predict", "--checkpoint", run, "-o", tmp_path / "scores.parquet")
    rows, scores, labels = scores_of(tmp_path / "scores.parquet")
    evaluated = evaluate_checkpoint(run, None, None, split="all", progress=False)
    assert predicted["rows"] == evaluated["rows"] == len(rows) and rows.tolist() == list(range(len(rows)))
    assert roc_auc_score(labels, scores) == pytest.approx(evaluated["auc"], abs=1e-6)
    cli(capsys, "export", "--checkpoint", run, "-o", tmp_path / "model.pt2")
    cli(capsys, "predict", "--model", tmp_path / "model.pt2", "-o", tmp_path / "program.parquet")
    program_rows, program_scores, _ = scores_of(tmp_path / "program.parquet")
    assert np.array_equal(program_rows, rows) and np.abs(program_scores - scores).max() <= 1e-5


def mapped_file(address: int) -> str:
    """The file this process maps at ``address`` ('' for anonymous memory), from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(part, 16) for part in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"no mapping holds {address:#x}")


def test_hotlines_disk_tier_is_mapped_not_read(runs):
    predictor = Predictor.from_checkpoint(runs["hotline tiers"])
    weight = predictor.model.model.embeddings.weight
    assert mapped_file(weight.data_ptr()) == str(Path(predictor.source) / BASE_FILE)
