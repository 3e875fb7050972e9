"""``distrec train --tensorboard``: the metrics log's records as TensorBoard scalars, the speed
and time breakdown beside them, no duplicated steps after a resume, and one line without the
package."""

import json
import shutil
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from distrec.cli import main
from distrec.components.breakdown import COMPONENTS
from tiny_runs import TINY_DATA

# the tiny preset on tiny_runs' data set, the loss logged every 2 steps, evaluations every 4
TINY = ["--preset", "tiny", *[a for item in TINY_DATA for a in ("--set", item)], "--set", "train.log_every=2", "--eval-every", "4", "--no-progress"]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))


def train(*argv) -> None:
    assert main(["train", *map(str, argv)]) == 0


def scalars(run) -> dict[str, list[tuple[int, float]]]:
    """Tag -> (step, value) of every scalar TensorBoard shows for a run."""
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def logged(run, split: str, name: str) -> list[tuple[int, float]]:
    """(step, value) of ``name`` in the ``split`` records of a run's metrics.jsonl."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r[name]) for r in records if r["split"] == split]


def assert_same_points(shown: list[tuple[int, float]], log: list[tuple[int, float]]) -> None:
    """The same steps in the same order, the values equal as float32 (TensorBoard's precision)."""
    assert [s for s, _ in shown] == [s for s, _ in log]
    assert [v for _, v in shown] == pytest.approx([v for _, v in log], rel=1e-6)


def test_a_run_writes_its_metrics_speed_and_breakdown_as_tensorboard_scalars(tmp_path, capsys):
    run = tmp_path / "run"
    train(*TINY, "--split", "random:0.1:0.1", "--max-steps", 9, "--tensorboard", "--out", run)
    shown = scalars(run)
    assert [s for s, _ in logged(run, "train", "loss")] == [2, 4, 6, 8]
    assert_same_points(shown["train/loss"], logged(run, "train", "loss"))
    assert [s for s, _ in logged(run, "val", "auc")] == [4, 8, 9]
    for name in ("auc", "logloss", "accuracy", "ne"):
        assert_same_points(shown[f"val/{name}"], logged(run, "val", name))
        assert_same_points(shown[f"test/{name}"], logged(run, "test", name))
    assert [s for s, _ in shown["speed/samples_per_s"]] == [2, 4, 6, 8] and all(v > 0 for _, v in shown["speed/samples_per_s"])
    assert {f"breakdown_ms/{c}" for c in COMPONENTS} <= shown.keys()
    assert all(v > 0 for c in ("dense_forward", "backward", "optimizer") for _, v in shown[f"breakdown_ms/{c}"])
    assert "val/rows" not in shown and "train/epoch" not in shown


def test_a_run_without_the_flag_writes_no_event_files(tmp_path, capsys):
    train(*TINY, "--max-steps", 2, "--out", tmp_path / "run")
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_resuming_twice_from_one_checkpoint_shows_every_step_once(tmp_path, capsys):
    # the first resume logs steps 5-8, then the run goes back to its step-4 checkpoint (as
    # after a crash) and trains them again: TensorBoard shows the second resume's only
    run = tmp_path / "run"
    train(*TINY, "--max-steps", 4, "--tensorboard", "--out", run)
    shutil.copytree(run / "checkpoint", tmp_path / "step4")
    train("--resume", run, "--max-steps", 8, "--no-progress")
    shutil.rmtree(run / "checkpoint")
    shutil.copytree(tmp_path / "step4", run / "checkpoint")
    train("--resume", run, "--max-steps", 8, "--no-progress")
    shown = scalars(run)
    assert [s for s, _ in shown["train/loss"]] == [2, 4, 6, 8]
    assert_same_points(shown["train/loss"], logged(run, "train", "loss"))
    assert_same_points(shown["val/auc"], logged(run, "val", "auc"))
    assert [s for s, _ in shown["speed/samples_per_s"]] == [2, 4, 6, 8]


def test_tensorboard_can_be_switched_on_when_resuming(tmp_path, capsys):
    run = tmp_path / "run"
    train(*TINY, "--max-steps", 4, "--out", run)
    train("--resume", run, "--max-steps", 8, "--tensorboard", "--no-progress")
    assert [s for s, _ in scalars(run)["train/loss"]] == [6, 8]


def test_without_the_package_the_flag_fails_up_front_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard raises ImportError
    assert main(["train", *TINY, "--max-steps", "2", "--tensorboard", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["distrec: error: --tensorboard needs the tensorboard package; install it with pip install 'distrec[tensorboard]'"]
    assert not (tmp_path / "run").exists()


def test_a_hotline_run_logs_its_popular_fraction_beside_the_loss(tmp_path, capsys):
    run = tmp_path / "run"
    train(*TINY, "--hotline", "--hot-budget", "64KB", "--relearn-every", "2", "--sample-rate", "1", "--max-steps", 6, "--tensorboard", "--out", run)
    popular = logged(run, "train", "popular_fraction")
    assert [s for s, _ in popular] == [2, 4, 6] and popular[-1][1] > 0
    assert_same_points(scalars(run)["train/popular_fraction"], popular)
    assert_same_points(scalars(run)["train/hot_lookup_fraction"], logged(run, "train", "hot_lookup_fraction"))
