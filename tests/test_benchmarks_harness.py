"""The benchmarks' shared harness: interleaved rounds, samples, options, results and PNGs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
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


def test_finish_writes_the_json_and_prints_it_last(tmp_path, capsys):
    print("a table first")
    harness.finish({"ratio": 1.5, "runs": {"a": [1, 2]}}, tmp_path / "out" / "result.json")
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1]) == {"ratio": 1.5, "runs": {"a": [1, 2]}}
    assert json.loads((tmp_path / "out" / "result.json").read_text()) == json.loads(lines[-1])


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
