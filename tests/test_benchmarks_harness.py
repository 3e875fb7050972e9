"""The benchmarks' shared harness: interleaved rounds, clocks, samples, options, result records and PNGs."""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import harness  # noqa: E402


def test_interleaved_rounds_take_turns_in_a_fixed_or_a_seeded_random_order():
    calls = []
    systems = {name: (lambda r, name=name: calls.append((r, name)) or f"{name}{r}") for name in ("base", "a", "b")}
    results = harness.interleaved_rounds(systems, 2)
    assert calls == [(0, "base"), (0, "a"), (0, "b"), (1, "base"), (1, "a"), (1, "b")]
    assert results == {"base": ["base0", "base1"], "a": ["a0", "a1"], "b": ["b0", "b1"]}
    calls.clear()
    harness.interleaved_rounds(systems, 30, shuffle_seed=0)
    orders = {tuple(name for r, name in calls if r == k) for k in range(30)}
    assert len(orders) > 1 and all(sorted(o) == ["a", "b", "base"] for o in orders)
    assert [name for _, name in calls].count("a") == 30


@pytest.mark.parametrize(
    "order, want",
    [("alternate", [["base", "a", "b"], ["b", "a", "base"], ["base", "a", "b"]]), ("rotate", [["base", "a", "b"], ["a", "b", "base"], ["b", "base", "a"]])],
)
def test_rounds_can_alternate_or_rotate_the_order(order, want):
    calls = []
    harness.interleaved_rounds({name: (lambda r, name=name: calls.append(name)) for name in ("base", "a", "b")}, 3, order=order)
    assert [calls[i : i + 3] for i in (0, 3, 6)] == want
    with pytest.raises(ValueError, match="not both"):
        harness.interleaved_rounds({"a": lambda r: None}, 1, shuffle_seed=0, order=order)


def test_the_cpu_clock_is_the_wall_clock():
    result, ms = harness.timed_ms(lambda: time.sleep(0.02) or "done")
    assert result == "done" and 15 <= ms < 1000
    assert 15 <= harness.median_ms(lambda: time.sleep(0.02), 3, device=torch.device("cpu")) < 1000


def test_a_cuda_device_is_timed_by_events_after_a_synchronize(monkeypatch):
    events, synchronized = [], []

    class FakeEvent:
        def __init__(self, enable_timing):
            assert enable_timing
            events.append(self)

        def record(self):
            self.recorded = len(synchronized)

        def elapsed_time(self, end):
            assert synchronized, "read before the device synchronised"
            return 12.5

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: synchronized.append(device))
    assert harness.timed_ms(lambda: 7, "cuda:0") == (7, 12.5)
    assert len(events) == 2 and synchronized == [torch.device("cuda:0")]


def test_samples_give_the_median_and_the_spread():
    samples = harness.Samples([4.0, 1.0, 3.0, 2.0, 10.0])
    assert samples.median == 3.0
    assert samples.spread == pytest.approx(7.6 / 1.4)
    assert samples.summary()["values"] == [4.0, 1.0, 3.0, 2.0, 10.0]


def test_options_are_typed_by_their_defaults():
    parser = argparse.ArgumentParser()
    harness.add_options(parser, {"steps": 5, "lr": 0.1, "name": "x", "sizes": [1, 2], "place": True}, {"steps": "how many"})
    args = parser.parse_args(["--steps", "7", "--lr", "1e-3", "--sizes", "3", "4", "5", "--no-place"])
    assert (args.steps, args.lr, args.name, args.sizes, args.place) == (7, 0.001, "x", [3, 4, 5], False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--steps", "1.5"])


def test_a_record_has_the_schema_and_finish_prints_it_last(tmp_path, capsys):
    print("a table first")
    record = harness.ResultRecord(
        "demo",
        [
            harness.SystemResult("baseline", "throughput", "samples/s", harness.Samples([10, 30, 20])),
            harness.SystemResult("candidate", "throughput", "samples/s", harness.Samples([40.0, 50.0]), extra={"peak_rss_bytes": 7}),
        ],
        ratio=2.25,
        extra={"config": {"steps": 3}},
    )
    returned = harness.finish(record, tmp_path / "out" / "result.json")
    lines = capsys.readouterr().out.strip().splitlines()
    want = {
        "benchmark": "demo",
        "systems": [
            {"system": "baseline", "metric": "throughput", "unit": "samples/s", "rounds": [10.0, 30.0, 20.0], "median": 20.0},
            {"system": "candidate", "metric": "throughput", "unit": "samples/s", "rounds": [40.0, 50.0], "median": 45.0, "peak_rss_bytes": 7},
        ],
        "ratio": 2.25,
        "config": {"steps": 3},
    }
    assert json.loads(lines[-1]) == returned == want
    assert json.loads((tmp_path / "out" / "result.json").read_text()) == returned
    with pytest.raises(ValueError, match="may not be named ratio"):
        harness.ResultRecord("demo", [], extra={"ratio": 1.0}).to_json()


def benchmark_scripts() -> list[Path]:
    return sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "harness.py")


@pytest.mark.parametrize("script", benchmark_scripts(), ids=lambda p: p.name)
def test_every_benchmark_script_imports_the_harness(script):
    imports = [alias.name for node in ast.parse(script.read_text()).body if isinstance(node, ast.Import) for alias in node.names]
    assert "harness" in imports, f"{script.name} does not import the harness at its top level"


def test_a_png_needs_labelled_axes(tmp_path):
    fig, (ax,) = harness.figure()
    harness.bars(ax, ["flat", "sptt"], {"iteration": [3.0, 2.0], "embedding": [1.0, 0.5]}, "ms per iteration")
    assert harness.save_png(fig, tmp_path / "ok.png").read_bytes()[:4] == b"\x89PNG"
    fig, (ax,) = harness.figure()
    ax.plot([1, 2], [3, 4])
    with pytest.raises(ValueError, match="unlabelled"):
        harness.save_png(fig, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def test_a_worker_runs_in_a_fresh_process_and_its_last_line_is_its_result(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("import json, os, sys\nprint('noise')\nprint(json.dumps({'spec': json.loads(sys.argv[2]), 'env': os.environ['X']}))\n")
    assert harness.run_worker(script, {"n": 3}, env={"X": "y"}) == {"spec": {"n": 3}, "env": "y"}
    script.write_text("import sys\nsys.exit('broken')\n")
    with pytest.raises(SystemExit, match="broken"):
        harness.run_worker(script, {})


def test_a_worker_under_another_interpreter_finds_distrec(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("import json, os\nprint(json.dumps(os.environ['PYTHONPATH'].split(os.pathsep)[0]))\n")
    assert harness.run_worker(script, {}, python=sys.executable) == harness.DISTREC_ROOT
