"""Defaults that suit the data: the optimizers, the batch size from the rows, and training until
the validation AUC stops improving, with the best model kept in ``best/``."""

import json

import pytest

from distrec import config
from distrec.cli import main
from distrec.train.early_stopping import BestModel
from tiny_runs import tiny_cli_flags

# the tiny preset on 1,000 synthetic rows (900 for training), nothing else chosen
SMALL = tiny_cli_flags(1000)


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_no_optimizer_chosen_is_adam_with_row_wise_adagrad_embeddings():
    t = config.load().train
    assert (t.optimizer, t.lr, t.embedding_optimizer, t.embedding_lr) == (None, None, None, None)  # the config stays as given
    chosen = config.chosen_optimizers(t)
    assert (chosen.optimizer, chosen.lr, chosen.embedding_optimizer, chosen.embedding_lr) == ("adam", 0.001, "adagrad", config.DEFAULT_SETUP["embedding_lr"])


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["train.optimizer=sgd"], ("sgd", 0.1, "sgd", 0.1)),  # as before: one optimizer for everything, at its lr
        (["train.optimizer=adagrad", "train.lr=0.05"], ("adagrad", 0.05, "adagrad", 0.05)),
        (["train.lr=0.01"], ("adam", 0.01, "adagrad", 0.01)),  # the embeddings take the given lr
        (["train.embedding_optimizer=sgd"], ("adam", 0.001, "sgd", 0.001)),
        (["train.embedding_lr=0.2"], ("adam", 0.001, "adagrad", 0.2)),
    ],
)
def test_a_chosen_optimizer_or_lr_keeps_its_meaning(overrides, expected):
    chosen = config.chosen_optimizers(config.load(None, overrides).train)
    assert (chosen.optimizer, chosen.lr, chosen.embedding_optimizer, chosen.embedding_lr) == expected


@pytest.mark.parametrize("rows, batch", [(900, 64), (3_942, 64), (32_768, 128), (72_000, 256), (300_000, 1024), (45_000_000, 1024)])
def test_the_batch_size_grows_with_the_training_rows(rows, batch):
    assert config.auto_batch_size(rows) == batch


def test_best_model_counts_evaluations_without_improvement():
    best = BestModel(patience=2)
    assert best.update({"auc": 0.6}, 10) and not best.exhausted
    assert not best.update({"auc": 0.60001}, 20)  # within min_delta: no better
    assert best.update({"auc": 0.7}, 30)
    assert not best.update({"auc": 0.65}, 40) and not best.exhausted
    assert not best.update({"auc": float("nan")}, 50) and best.exhausted
    again = BestModel(patience=2)
    again.load_state_dict(best.state_dict())
    assert (again.step, again.auc, again.metrics, again.exhausted) == (30, 0.7, {"auc": 0.7}, True)


def test_without_a_length_training_stops_when_the_validation_auc_stops_improving(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--patience", "2", "--out", str(run)]) == 0
    err = capsys.readouterr().err
    assert "batch size 64 for 900 training rows" in err and "until the validation AUC stops improving for 2 evaluations, one every 4 steps" in err
    summary = json.loads((run / "summary.json").read_text())
    val = [r for r in records(run) if r["split"] == "val"]
    assert [r["step"] for r in val] == list(range(4, summary["steps"] + 1, 4))
    best = max(val, key=lambda r: r["auc"])
    assert summary["stopped"] == "no better validation AUC in 2 evaluations"
    assert summary["best_step"] == best["step"] == val[-3]["step"]  # then 2 evaluations without a better one
    assert summary["auc"] == best["auc"]  # the summary reports the best model ...
    assert json.loads((run / "best" / "meta.json").read_text())["step"] == best["step"]
    assert json.loads((run / "checkpoint" / "meta.json").read_text())["step"] == summary["steps"]  # ... and resumes from the last

    assert main(["evaluate", "--checkpoint", str(run), "--no-progress"]) == 0  # evaluate scores the best model
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["checkpoint"].endswith("best") and scored["auc"] == pytest.approx(best["auc"], abs=1e-6)


def test_resuming_a_run_that_stopped_early_has_nothing_to_do(tmp_path, capsys, caplog):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--patience", "1", "--out", str(run)]) == 0
    steps = json.loads((run / "summary.json").read_text())["steps"]
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert f"stopped at step {steps}, no better validation AUC in 1 evaluation: nothing to do" in caplog.text
    assert main(["train", "--resume", str(run), "--max-steps", str(steps + 3), "--no-progress"]) == 0  # a fixed length trains on
    assert json.loads((run / "summary.json").read_text())["steps"] == steps + 3


def test_a_run_of_fixed_length_keeps_no_best_model(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--max-steps", "6", "--eval-every", "2", "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"] == "reached --max-steps" and "best_step" not in summary and not (run / "best").exists()


def test_overfitting_is_warned_once_by_a_rising_loss_or_an_ne_above_one():
    from distrec.train.early_stopping import OverfitWatch

    watch = OverfitWatch(min_steps=100)
    assert watch.check({"logloss": 0.50, "ne": 0.9}, 10) is None
    assert watch.check({"logloss": 0.51, "ne": 0.9}, 20) is None
    assert watch.check({"logloss": 0.52, "ne": 0.9}, 30) is None
    assert "rose for 3 evaluations in a row at step 40" in watch.check({"logloss": 0.53, "ne": 0.9}, 40)
    assert watch.check({"logloss": 0.54, "ne": 1.2}, 150) is None  # once per run
    early, late = OverfitWatch(min_steps=100), OverfitWatch(min_steps=100)
    assert early.check({"logloss": 0.7, "ne": 1.1}, 50) is None  # before an epoch: not yet
    assert "NE is 1.100" in late.check({"logloss": 0.7, "ne": 1.1}, 150)
