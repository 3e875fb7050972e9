"""The interaction benchmark: its plain baseline equals distrec's interaction, and its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import interaction as bench  # noqa: E402
from distrec.models.interaction import DotInteraction  # noqa: E402


def test_the_plain_baseline_computes_distrecs_interaction():
    g = torch.Generator().manual_seed(0)
    dense, sparse = torch.randn(5, 8, generator=g), torch.randn(5, 4, 8, generator=g)
    torch.testing.assert_close(bench.PlainDotInteraction(4)(dense, sparse), DotInteraction(4)(dense, sparse))


def test_a_small_run_prints_one_json_object_with_every_part(capsys):
    result = bench.main(["--batch", "40", "--threads", "1", "--rounds", "1", "--repeats", "1"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(result))
    assert set(last["speedup"]) == {"interaction_1t", "dense_1t"}
    assert all(v > 0 for v in last["speedup"].values())
