"""The bag-kernel benchmark: it checks the kernels against the torch operators, single- and multi-hot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bag_kernels as bench  # noqa: E402


@pytest.mark.parametrize("pooling_factor", ["1", "3"])
def test_a_small_run_prints_one_json_object_with_every_part(capsys, pooling_factor):
    result = bench.main(
        ["--tables", "2", "--rows", "1000", "--batch", "32", "--pooling-factor", pooling_factor, "--threads", "1", "--rounds", "1", "--repeats", "1"]
    )
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(result))
    assert [r["part"] for r in last["results"]] == ["lookup", "grouping", "update"]
    assert all(r["torch_ms"] > 0 and r["kernels_ms"] > 0 for r in last["results"])
