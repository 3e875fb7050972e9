"""The huge-page benchmark: both tables hold the same rows, and its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import huge_pages as bench  # noqa: E402


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps_rollup")
def test_a_small_run_prints_one_json_object_with_every_part(capsys):
    result = bench.main(["--tables", "2", "--rows", "40000", "--batch", "64", "--pooling-factor", "3", "--threads", "1", "--rounds", "1", "--repeats", "1"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(result))
    assert [(r["part"], r["threads"]) for r in last["results"]] == [("lookup", 1), ("update", 1)]
    assert all(r["small_pages_ms"] > 0 and r["huge_pages_ms"] > 0 for r in last["results"])
    assert 0.0 <= last["huge_page_share"]
