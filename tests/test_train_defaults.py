"""Defaults that suit the data: the optimizers, the batch size from the rows, and training until
the validation loss stops improving, with the best model kept in ``best/``."""

import json

import numpy as np
import pytest

from distrec import config
from distrec.cli import main
from distrec.train.early_stopping import BestModel, small_validation_warning
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
    assert best.update({"logloss": 0.6, "auc": 0.6}, 10) and not best.exhausted
    assert not best.update({"logloss": 0.59995}, 20)  # within min_delta: no better
    assert best.update({"logloss": 0.5}, 30)
    assert not best.update({"logloss": 0.55}, 40) and not best.exhausted
    assert not best.update({"logloss": float("nan")}, 50) and best.exhausted
    again = BestModel(patience=2)
    again.load_state_dict(best.state_dict())
    assert (again.step, again.logloss, again.metrics, again.exhausted) == (30, 0.5, {"logloss": 0.5}, True)


def test_the_best_model_is_the_lowest_loss_not_the_highest_auc():
    best = BestModel(patience=5)
    assert best.update({"logloss": 0.50, "auc": 0.70, "ne": 0.9}, 10)
    # a better ranking with wild probabilities: worse than predicting the click rate
    assert not best.update({"logloss": 1.70, "auc": 0.75, "ne": 3.1}, 20)
    assert best.step == 10 and best.metrics["ne"] == 0.9


def test_a_best_model_state_saved_when_auc_chose_it_resumes_on_its_loss():
    best = BestModel(patience=2)
    best.load_state_dict({"auc": 0.7, "step": 30, "metrics": {"auc": 0.7, "logloss": 0.5}, "since_best": 1})
    assert (best.step, best.logloss, best.since_best) == (30, 0.5, 1)
    assert not best.update({"logloss": 0.52, "auc": 0.8}, 40) and best.exhausted


def test_a_tiny_validation_split_is_warned_about():
    assert small_validation_warning(np.r_[np.ones(100), np.zeros(300)]) is None
    warning = small_validation_warning(np.r_[np.ones(12), np.zeros(38)])
    assert warning is not None and "50 rows (12 clicks, 38 non-clicks)" in warning and "--split random:0.2" in warning
    assert small_validation_warning(np.zeros(5000)) is not None  # one class only


def test_without_a_length_training_stops_when_the_validation_loss_stops_improving(tmp_path, capsys, caplog):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--patience", "2", "--out", str(run)]) == 0
    err = capsys.readouterr().err
    assert "batch size 64 for 900 training rows" in err and "until the validation loss stops improving for 2 evaluations, one every 4 steps" in err
    assert "the validation split holds 100 rows" in caplog.text  # too few to choose on: warned
    summary = json.loads((run / "summary.json").read_text())
    val = [r for r in records(run) if r["split"] == "val"]
    assert [r["step"] for r in val] == list(range(4, summary["steps"] + 1, 4))
    best = min(val, key=lambda r: r["logloss"])
    assert summary["stopped"] == "no lower validation loss in 2 evaluations"
    assert summary["best_step"] == best["step"] == val[-3]["step"]  # then 2 evaluations without a better one
    assert summary["auc"] == best["auc"] and summary["logloss"] == best["logloss"]  # the summary reports the best model ...
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
    assert f"stopped at step {steps}, no lower validation loss in 1 evaluation: nothing to do" in caplog.text
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
