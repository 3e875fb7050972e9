"""The single-process training loop through ``distrec train``: exact resume, warm-up and decay,
evaluation records."""

import json

import pytest
import torch

from distrec.cli import main
from distrec.errors import DistrecError
from distrec.train.evaluate import load_trained_model
from test_cli import ANNOUNCED_OPTIMIZERS, ANNOUNCED_RUN
from tiny_runs import tiny_cli_flags

# 600 synthetic rows (540 train = 9 batches of 64 per epoch), small tables, one thread
TINY = tiny_cli_flags(600, "--batch-size", "64", "--seed", "3", "--optimizer", "sgd", "--eval-every", "4")


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


def train_whole_and_resumed(tmp_path, flags, length, stop, total):
    """``flags`` trained to ``total`` (``length``: --max-steps or --epochs) in one go into
    tmp_path/whole, and to ``stop`` then resumed to ``total`` into tmp_path/halves."""
    train(*flags, length, total, "--out", tmp_path / "whole")
    train(*flags, length, stop, "--out", tmp_path / "halves")
    train("--resume", tmp_path / "halves", length, total, "--no-progress")


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_resumed_run_equals_uninterrupted_run(tmp_path, capsys, optimizer):
    # 14 steps cross the epoch boundary at step 9; the break at 7 is mid-epoch and between
    # two evaluations, with warm-up and decay running across it. The decay has a fixed
    # length: by default it spans the run, so a 7-step run would decay to 0 by its end.
    flags = [*TINY, "--optimizer", optimizer, "--set", "train.warmup_steps=3", "--set", "train.decay=linear", "--set", "train.decay_steps=14"]
    train_whole_and_resumed(tmp_path, flags, "--max-steps", 7, 14)
    capsys.readouterr()
    assert_same_run(tmp_path / "whole", tmp_path / "halves", 7)
    assert [r["step"] for r in outcome(tmp_path / "halves")[1]] == [4, 7, 8, 12, 14]


def test_a_run_resumed_inside_an_epoch_of_fresh_synthetic_rows_equals_the_uninterrupted_one(tmp_path, capsys):
    # epoch 1 (steps 10-18) draws new rows; the break at step 11 falls inside it
    train_whole_and_resumed(tmp_path, TINY, "--max-steps", 11, 14)
    capsys.readouterr()
    assert_same_run(tmp_path / "whole", tmp_path / "halves", 11)


def test_resume_by_epochs(tmp_path, capsys):
    train_whole_and_resumed(tmp_path, TINY, "--epochs", 1, 2)
    capsys.readouterr()
    assert_same_run(tmp_path / "whole", tmp_path / "halves", 9)
    assert outcome(tmp_path / "whole")[2]["steps"] == 18


def test_training_beats_chance_on_the_planted_click_model(tmp_path, capsys):
    train(*TINY, "--set", "data.synthetic.rows=4000", "--optimizer", "adagrad", "--lr", "0.05", "--epochs", 3, "--out", tmp_path / "run")
    capsys.readouterr()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["auc"] > 0.6


def test_resume_with_nothing_left_to_do_says_so_and_writes_nothing(tmp_path, capsys, caplog):
    train(*TINY, "--max-steps", 5, "--out", tmp_path / "run")
    before = {name: (tmp_path / "run" / name).read_text() for name in ("metrics.jsonl", "summary.json")}
    train("--resume", tmp_path / "run", "--max-steps", 5, "--no-progress")
    assert "nothing to do" in caplog.text
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(before["summary.json"])
    assert {name: (tmp_path / "run" / name).read_text() for name in before} == before


def test_a_diverging_run_stops_at_the_step_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    code = main(["train", *TINY, "--lr", "1e4", "--max-steps", "50", "--set", "train.checkpoint_every=1", "--out", str(tmp_path / "run")])
    error = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith((ANNOUNCED_RUN, ANNOUNCED_OPTIMIZERS))]
    assert code == 2 and len(error) == 1 and "training diverged, lower the learning rate" in error[0]
    failed_at = int(error[0].split(" at step ")[1].split(";")[0])
    meta = json.loads((tmp_path / "run" / "checkpoint" / "meta.json").read_text())
    assert meta["step"] == failed_at - 1 and f"the last checkpoint (step {failed_at - 1}) is kept" in error[0]
    model, *_ = load_trained_model(tmp_path / "run", torch.device("cpu"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_evaluate_without_data_scores_the_runs_own_holdout(tmp_path, capsys):
    from distrec.train.evaluate import evaluate_checkpoint

    train(*TINY, "--max-steps", 6, "--out", tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    result = evaluate_checkpoint(tmp_path / "run", None, None, progress=False)
    assert result["scored"] == "the run's val split" and result["rows"] == summary["val_rows"] < 600
    assert result["auc"] == pytest.approx(summary["auc"], abs=1e-6)
    with pytest.raises(DistrecError, match="the run kept no test rows .* score --split val or all"):
        evaluate_checkpoint(tmp_path / "run", None, None, progress=False, split="test")


def test_a_hotline_run_that_ends_before_its_first_hot_set_says_so(tmp_path, capsys, caplog):
    train(*TINY, "--hotline", "--hot-budget", "64KB", "--relearn-every", "100", "--max-steps", 5, "--out", tmp_path / "run")
    assert "Hotline never engaged" in caplog.text and "lower --relearn-every, raise --sample-rate" in caplog.text
    caplog.clear()
    train(*TINY, "--hotline", "--hot-budget", "64KB", "--relearn-every", "2", "--sample-rate", "1", "--max-steps", 5, "--out", tmp_path / "engaged")
    assert "Hotline never engaged" not in caplog.text


def test_one_process_says_which_multi_process_settings_it_ignores_and_a_resume_says_where_it_starts(tmp_path, capsys, caplog):
    train(*TINY, "--sharding", "column_wise", "--max-steps", 3, "--out", tmp_path / "run")
    assert "ignored in one process: --sharding (multi-process settings)" in caplog.text
    capsys.readouterr()
    train("--resume", tmp_path / "run", "--max-steps", 5, "--no-progress")
    err = capsys.readouterr().err
    assert f"resuming from step 3 of {tmp_path / 'run' / 'checkpoint'}\n" in err


def test_an_exploding_finite_loss_stops_the_run_as_a_nan_does(tmp_path, capsys):
    """The default optimizers at --lr 1e4 reach losses of 1e27 without a NaN."""
    code = main(["train", *TINY, "--lr", "1e4", "--optimizer", "adam", "--max-steps", "30", "--out", str(tmp_path / "run")])
    error = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("distrec: error:")]
    assert code == 2 and len(error) == 1 and "training diverged, lower the learning rate" in error[0]
