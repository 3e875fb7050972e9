"""The 2D benchmark's CI-safe variant: plain processes on the loopback, its cluster part only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "two_d.py"


def test_two_d_runs_without_namespaces(tmp_path):
    argv = [sys.executable, str(BENCHMARK), "--no-netns", "--quick", "--parts", "cluster", "--steps", "6", "--sync-every", "3", "--out", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    table = summary["cluster"]["configurations"]
    assert list(table) == ["full", "exact", "periodic_k3"]
    full, exact, periodic = (table[n]["measured"] for n in table)
    assert exact["auc"] == pytest.approx(full["auc"], abs=1e-4)  # exact 2D trains the model full sharding trains
    assert full["bytes"]["replica_sync"] == 0 < periodic["bytes"]["replica_sync"]
    assert exact["bytes"]["all_to_all"] < full["bytes"]["all_to_all"]  # the all-to-all spans 2 ranks, not 4
    assert summary["speedup_exact"] == exact["speedup"] and full["speedup"] == 1.0 and summary["speedup_periodic_k10"] is None
    for name, entry in table.items():
        predicted, measured = entry["predicted"], entry["measured"]
        # same model, batch and tables: the simulator's all-to-all and all-reduce bytes are the trainer's
        assert predicted["all_to_all"]["bytes"] == pytest.approx(measured["bytes"]["all_to_all"], rel=1e-9)
        assert predicted["all_reduce"]["bytes"] == pytest.approx(measured["bytes"]["all_reduce"], rel=1e-9)
        assert summary["predicted_vs_measured_ms"][name] == [predicted["total_ms"], measured["iteration_ms"]]
        run = json.loads((tmp_path / name / "round0" / "summary.json").read_text())
        assert run["steps"] == 6 and run["world_size"] == 4 and run.get("replica_groups", 1) == (1 if name == "full" else 2)
    # exact sync moves the distinct rows a group touched: as many as Zipf access predicts (seeded data)
    assert table["exact"]["predicted"]["replica_sync"]["bytes"] == pytest.approx(exact["bytes"]["replica_sync"], rel=0.1)
    # 6 steps, a sync every 3 (row-wise Adagrad: touched rows merged): twice the rows each group touched in 3 steps, as Zipf access predicts
    assert json.loads((tmp_path / "periodic_k3" / "round0" / "summary.json").read_text())["replica_average"] == "touched"
    assert table["periodic_k3"]["predicted"]["replica_sync"]["bytes"] == pytest.approx(periodic["bytes"]["replica_sync"], rel=0.1)
    # the ring check: all-reduces of the calibration's sizes over the 4 ranks, timed and predicted
    check = summary["cluster"]["all_reduce_check"]
    assert [c["bytes"] for c in check] == [32 << 10, 2 << 20, 4 << 20]
    assert all(c["measured_ms"] > 0 and c["predicted_ms"] > 0 for c in check)
    assert summary["cluster"]["links"]["collective_wait_ms"] >= 0
    assert json.loads((tmp_path / "two_d.json").read_text()) == summary
