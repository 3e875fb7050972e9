"""The single-process training loop through ``distrec train``: exact resume, warm-up and decay,
evaluation records."""

import json

import pytest
import torch

from distrec.cli import main
from distrec.train.evaluate import load_trained_model

# 600 synthetic rows (540 train = 9 batches of 64 per epoch), small tables, one thread
TINY = ["--preset", "tiny", "--set", "data.synthetic.rows=600", "--set", "data.synthetic.table_rows=50",
        "--set", "train.threads=1", "--batch-size", "64", "--seed", "3", "--eval-every", "4", "--no-progress"]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))


def train(*argv) -> None:
    assert main(["train", *map(str, argv)]) == 0


def outcome(run):
    """(parameters, metrics records, summary without speed) of a finished run."""
    model, *_ = load_trained_model(run, torch.device("cpu"))
    summary = json.loads((run / "summary.json").read_text())
    summary.pop("samples_per_s")
    summary.pop("peak_rss_bytes_per_rank")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return model.state_dict(), records, summary


def assert_same_run(whole, resumed, break_step):
    """Equal parameters, summaries and evaluations; the resumed run also logged its first end."""
    params_a, records_a, summary_a = outcome(whole)
    params_b, records_b, summary_b = outcome(resumed)
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], rtol=0, atol=0, msg=name)
    assert records_a == [r for r in records_b if r["step"] != break_step]
    assert summary_a == summary_b


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_resumed_run_equals_uninterrupted_run(tmp_path, capsys, optimizer):
    # 14 steps cross the epoch boundary at step 9; the break at 7 is mid-epoch and between
    # two evaluations, with warm-up and decay running across it. The decay has a fixed
    # length: by default it spans the run, so a 7-step run would decay to 0 by its end.
    flags = [*TINY, "--optimizer", optimizer, "--set", "train.warmup_steps=3", "--set", "train.decay=linear",
             "--set", "train.decay_steps=14"]
    train(*flags, "--max-steps", 14, "--out", tmp_path / "whole")
    train(*flags, "--max-steps", 7, "--out", tmp_path / "halves")
    train("--resume", tmp_path / "halves", "--max-steps", 14, "--no-progress")
    capsys.readouterr()
    assert_same_run(tmp_path / "whole", tmp_path / "halves", 7)
    assert [r["step"] for r in outcome(tmp_path / "halves")[1]] == [4, 7, 8, 12, 14]


def test_resume_by_epochs(tmp_path, capsys):
    train(*TINY, "--epochs", 2, "--out", tmp_path / "whole")
    train(*TINY, "--epochs", 1, "--out", tmp_path / "halves")
    train("--resume", tmp_path / "halves", "--epochs", 2, "--no-progress")
    capsys.readouterr()
    assert_same_run(tmp_path / "whole", tmp_path / "halves", 9)
    assert outcome(tmp_path / "whole")[2]["steps"] == 18


def test_training_beats_chance_on_the_planted_click_model(tmp_path, capsys):
    train(*TINY, "--set", "data.synthetic.rows=4000", "--optimizer", "adagrad", "--lr", "0.05", "--epochs", 3,
          "--out", tmp_path / "run")
    capsys.readouterr()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["auc"] > 0.6
