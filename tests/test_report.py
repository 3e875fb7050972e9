"""``distrec report``: one bar per run directory labelled by it, readable with 10 runs; loss and
AUC curves per run from metrics.jsonl; runs with only one of the two files; one-line errors."""

import json
from pathlib import Path

import pytest

from distrec.cli import main
from distrec.components.breakdown import COMPONENTS
from distrec.errors import DistrecError
from distrec.report import breakdown_figure, curves_figure, run_labels
from tiny_runs import TINY_DATA


def fake_run(run: Path, ms: float | None = None, steps: int | None = None) -> Path:
    """A run directory with a breakdown.json (every component ``ms`` ms, the label every run of
    one configuration gets) and/or a metrics.jsonl (loss 1/step, AUC 0.5 + step/1000)."""
    run.mkdir(parents=True)
    if ms is not None:
        components = {c: {"mean_ms": ms, "median_ms": ms} for c in COMPONENTS}
        (run / "breakdown.json").write_text(json.dumps({"components": components, "steps": 10, "label": "2p sharded table_wise"}))
    if steps is not None:
        records = []
        for step in range(1, steps + 1):
            records.append({"step": step, "epoch": 0, "split": "train", "loss": 1 / step})
            if step % 2 == 0:
                records.append({"step": step, "epoch": 0, "split": "val", "auc": 0.5 + step / 1000, "rows": 10})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def bar_rows(fig) -> dict[str, float]:
    """y tick label -> total width of the stacked bar on that row, of the breakdown figure."""
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    totals = [0.0] * len(labels)
    for container in ax.containers:
        assert len(container.patches) == len(labels)
        for i, patch in enumerate(container.patches):
            assert patch.get_y() + patch.get_height() / 2 == pytest.approx(ax.get_yticks()[i])
            totals[i] += patch.get_width()
    return dict(zip(labels, totals))


def test_runs_sharing_a_configuration_label_get_one_bar_each_labelled_by_directory(tmp_path):
    runs = [fake_run(tmp_path / "a" / "run", 1.0), fake_run(tmp_path / "b" / "run", 2.0), fake_run(tmp_path / "c", 3.0), fake_run(tmp_path / "d", 4.0)]
    fig = breakdown_figure(runs)
    n = len(COMPONENTS)  # every component 1, 2, 3 or 4 ms
    assert bar_rows(fig) == pytest.approx({"a/run": n * 1.0, "b/run": n * 2.0, "c": n * 3.0, "d": n * 4.0})
    assert len(fig.axes[0].containers) == len(COMPONENTS)


def test_ten_runs_with_long_names_have_labels_that_do_not_overlap(tmp_path):
    runs = [fake_run(tmp_path / f"hybrid-parallel-run-{i:02d}-row-wise-sharding", float(i + 1)) for i in range(10)]
    fig = breakdown_figure(runs)
    assert len(bar_rows(fig)) == 10
    fig.canvas.draw()
    boxes = sorted((t.get_window_extent() for t in fig.axes[0].get_yticklabels()), key=lambda b: b.y0)
    assert all(below.y1 <= above.y0 for below, above in zip(boxes, boxes[1:]))
    inside = fig.bbox
    assert all(b.x0 >= inside.x0 and b.y0 >= inside.y0 and b.y1 <= inside.y1 for b in boxes)
    assert fig.get_figheight() > breakdown_figure(runs[:2]).get_figheight()


def test_labels_are_directory_names_made_unique_by_their_parents(tmp_path):
    assert run_labels([tmp_path / "x" / "r", tmp_path / "y" / "r", tmp_path / "r"]) == ["x/r", "y/r", f"{tmp_path.name}/r"]
    assert run_labels([tmp_path / "one", tmp_path / "two"]) == ["one", "two"]
    with pytest.raises(DistrecError, match="given twice"):
        run_labels([tmp_path / "one", tmp_path / "x" / ".." / "one"])


def test_curves_draw_loss_and_auc_one_line_per_run(tmp_path):
    runs = [fake_run(tmp_path / "a" / "run", steps=6), fake_run(tmp_path / "b" / "run", steps=4), fake_run(tmp_path / "bars-only", ms=1.0)]
    fig = curves_figure(runs)
    loss_ax, auc_ax = fig.axes
    assert [line.get_label() for line in loss_ax.get_lines()] == ["a/run", "b/run"]
    assert [line.get_label() for line in auc_ax.get_lines()] == ["a/run", "b/run"]
    assert list(loss_ax.get_lines()[0].get_xdata()) == [1, 2, 3, 4, 5, 6]
    assert list(loss_ax.get_lines()[1].get_ydata()) == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4])
    assert list(auc_ax.get_lines()[0].get_xdata()) == [2, 4, 6] and list(auc_ax.get_lines()[0].get_ydata()) == pytest.approx([0.502, 0.504, 0.506])
    assert (loss_ax.get_xlabel(), loss_ax.get_ylabel(), auc_ax.get_xlabel(), auc_ax.get_ylabel()) == ("step", "loss", "step", "AUC")
    assert [t.get_text() for t in auc_ax.get_legend().get_texts()] == ["a/run", "b/run"]


def test_distrec_report_on_real_runs_writes_both_images(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))
    tiny = ["--preset", "tiny", *[a for item in TINY_DATA for a in ("--set", item)], "--set", "train.log_every=2", "--eval-every", "3", "--no-progress"]
    for name in ("first", "second"):
        assert main(["train", *tiny, "--max-steps", "6", "--out", str(tmp_path / name)]) == 0
    (tmp_path / "second" / "breakdown.json").unlink()  # as after an aborted run
    capsys.readouterr()
    assert main(["report", str(tmp_path / "first"), str(tmp_path / "second"), "-o", str(tmp_path / "out" / "cmp.png")]) == 0
    written = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert written == {"breakdown": str(tmp_path / "out" / "cmp.png"), "curves": str(tmp_path / "out" / "cmp-curves.png")}
    assert all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in written.values())
    assert list(bar_rows(breakdown_figure([tmp_path / "first", tmp_path / "second"]))) == ["first"]
    lines = curves_figure([tmp_path / "first", tmp_path / "second"]).axes[0].get_lines()
    assert [(line.get_label(), list(line.get_xdata())) for line in lines] == [("first", [2, 4, 6]), ("second", [2, 4, 6])]
    assert main(["report", str(tmp_path / "second")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"breakdown": None, "curves": str(tmp_path / "second" / "curves.png")}


def test_a_directory_with_neither_file_is_one_error_line(tmp_path, capsys):
    fake_run(tmp_path / "good", ms=1.0, steps=2)
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "good"), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'" + str(tmp_path / "empty") + "' holds neither breakdown.json nor metrics.jsonl" in err[0]
    assert not (tmp_path / "good" / "breakdown.png").exists()
