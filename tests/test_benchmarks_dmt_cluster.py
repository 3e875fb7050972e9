"""The emulated-cluster benchmark's CI-safe variant: plain processes on the loopback, one host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "dmt_cluster.py"


def test_dmt_cluster_runs_without_namespaces(tmp_path):
    argv = [
        sys.executable,
        str(BENCHMARK),
        "--no-netns",
        "--hosts",
        "1",
        "--ranks-per-host",
        "2",
        "--features",
        "6",
        "--dim",
        "8",
        "--table-rows",
        "200",
        "--global-batch",
        "128",
        "--eval-rows",
        "256",
        "--steps",
        "6",
        "--warmup",
        "2",
        "--compressions",
        "2",
        "4",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(summary["schemes"]) == ["flat", "sptt", "dmt_cr2", "dmt_cr4"]
    flat, sptt = summary["schemes"]["flat"], summary["schemes"]["sptt"]
    assert sptt["auc"] == flat["auc"] and sptt["logloss"] == flat["logloss"]  # SPTT trains the same model
    assert summary["speedup_sptt"] == flat["iteration_ms"] / sptt["iteration_ms"]
    assert summary["schemes"]["dmt_cr4"]["compression"] > summary["schemes"]["dmt_cr2"]["compression"] > 1
    assert all(r["cross_host_payload_bytes"] == 0 for r in summary["schemes"].values())  # one host
    assert json.loads((tmp_path / "dmt_cluster.json").read_text()) == summary
    for name, scheme in summary["schemes"].items():  # each trained by distrec's trainer, in its own run folder
        run = json.loads((tmp_path / name / "summary.json").read_text())
        assert run["auc"] == scheme["auc"] and run["steps"] == 6 and run["world_size"] == 2
        assert 0 < scheme["output_exchange_ms"] <= scheme["embedding_forward_ms"] < scheme["iteration_ms"]
    assert "lookup: sptt" in (tmp_path / "sptt" / "config.yaml").read_text()
    assert "tower_module: dlrm" in (tmp_path / "dmt_cr2" / "config.yaml").read_text()
    assert (tmp_path / "dmt_cluster.png").read_bytes()[:4] == b"\x89PNG"
