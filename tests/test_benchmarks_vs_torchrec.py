"""The TorchRec comparison's own parts: distrec's side on a small workload, the result record, and the missing peer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import vs_torchrec as bench  # noqa: E402


def test_distrec_side_trains_the_workload_and_reports_its_components(tmp_path):
    w = bench.Workload(pooling_factor=2, procs=1, optimizer="adagrad", distribution="zipf", steps=7, batch_size=64, num_tables=3, table_rows=500, dim=8)
    speed, components = bench.run_distrec(w, tmp_path)
    (run,) = [p for p in tmp_path.iterdir() if p.name.startswith("distrec-")]
    breakdown = json.loads((run / "breakdown.json").read_text())["components"]
    step_ms = sum(c["mean_ms"] for c in breakdown.values())
    assert speed == pytest.approx(w.batch_size / step_ms * 1e3)  # samples/s from the step's components
    assert components == {k: round(c["mean_ms"], 1) for k, c in breakdown.items() if c["mean_ms"] > 0.5}
    assert not (run / "checkpoint").exists()  # checkpoints are removed: they filled a disk


def test_the_record_has_a_system_per_side_and_configuration():
    one = bench.Workload(1, 1, "sgd", "uniform", 20)
    two = bench.Workload(20, 2, "adagrad", "uniform", 20)
    speeds = {one: {"distrec": [30.0, 36.0, 33.0], "torchrec": [20.0, 20.0, 22.0]}, two: {"distrec": [10.0, 12.0, 11.0], "torchrec": [10.0, 8.0, 9.0]}}
    parts = {w: {"distrec": [], "torchrec": []} for w in speeds}
    results = bench.summarize(speeds, parts, profile=False)
    assert [(r["ratio"], r["round_ratios"], r["median_round_ratio"]) for r in results] == [(1.65, [1.5, 1.8, 1.5], 1.5), (1.222, [1.0, 1.5, 1.222], 1.222)]
    record = bench.record(speeds, results, {"distribution": "uniform"}).to_json()
    assert record["benchmark"] == "vs_torchrec" and record["ratio"] is None  # several configurations: their ratios are in results
    assert [s["system"] for s in record["systems"]] == [
        "distrec (pooling 1, 1 proc, sgd)",
        "torchrec (pooling 1, 1 proc, sgd)",
        "distrec (pooling 20, 2 proc, adagrad)",
        "torchrec (pooling 20, 2 proc, adagrad)",
    ]
    assert record["systems"][0]["median"] == 33.0 and record["systems"][0]["unit"] == "samples/s"
    assert bench.record({one: speeds[one]}, results[:1], {"distribution": "uniform"}).ratio == 1.65


def test_without_torchrec_it_says_how_to_install_it():
    if bench.torchrec_importable(sys.executable):
        pytest.skip("TorchRec is installed here")
    done = subprocess.run([sys.executable, bench.__file__, "--rounds", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--torchrec-python" in done.stderr
