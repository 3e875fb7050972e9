"""The half-precision tables benchmark: its quick form end to end, its options and paired differences."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import half_tables as ht  # noqa: E402

CRITEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo" / "criteo_kaggle_sample.tsv"


def test_paired_differences_are_taken_seed_by_seed():
    diff = ht.paired_difference([0.7012, 0.7000, 0.6990], [0.7000, 0.7010, 0.6990], target=0.001)
    assert diff["per_seed"] == pytest.approx([0.0012, -0.0010, 0.0])
    assert diff["mean"] == pytest.approx(0.0002 / 3) and diff["max_abs"] == pytest.approx(0.0012)
    assert diff["sd"] == pytest.approx(0.0011015141, rel=1e-6)
    assert diff["within_target"]
    assert not ht.paired_difference([0.71, 0.72], [0.70, 0.70], target=0.001)["within_target"]
    with pytest.raises(ValueError):
        ht.paired_difference([0.7], [0.7, 0.7], target=0.001)


def test_quick_sets_defaults_that_given_options_override_and_fp32_always_runs_first():
    quick = ht.parse_args(["--quick"])
    assert quick.dtypes == ["fp32", "fp16"] and quick.seeds == [0] and quick.rounds == 1 and quick.procs == [1]
    given = ht.parse_args(["--quick", "--dtypes", "bf16", "--seeds", "3", "4"])
    assert given.dtypes == ["fp32", "bf16"] and given.seeds == [3, 4] and given.table_rows == ht.QUICK["table_rows"]
    assert ht.parse_args([]).seeds == [0, 1, 2, 3, 4] and ht.parse_args([]).pooling_factors == [1, 20]
    assert list(ht.speed_systems(ht.parse_args([]))) == ["fp32", ht.TORCH_OPERATORS, "fp16", "bf16"]
    with pytest.raises(SystemExit):
        ht.parse_args(["--speed-steps", "5"])  # the breakdown skips 5 warm-up steps: nothing would be timed


@pytest.mark.slow
@pytest.mark.skipif(not CRITEO.exists(), reason="needs ../shared/data/criteo")
def test_the_quick_form_measures_memory_speed_and_quality(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "half_tables.py"), "--quick", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record == json.loads((tmp_path / "half_tables.json").read_text())
    assert record["benchmark"] == "half_tables" and (tmp_path / "half_tables.png").stat().st_size > 0
    assert [s["system"] for s in record["systems"]] == [
        "memory 1p fp32",
        "memory 1p fp16",
        "speed pooling 20 fp32",
        "speed pooling 20 fp16",
        "quality criteo fp32",
        "quality criteo fp16",
    ]

    memory = record["memory"]["1p"]
    assert memory["fp16"]["table_bytes_per_rank"] * 2 == memory["fp32"]["table_bytes_per_rank"] == 26 * 20_000 * 64 * 4
    for dtype in ("fp32", "fp16"):
        big, small = memory[dtype]["peak_rss_bytes_per_rank"], memory[dtype]["baseline_peak_rss_bytes_per_rank"]
        assert memory[dtype]["table_rss_bytes_per_rank"] == [big[0] - small[0]]
    # 133 MB of float32 rows against 67 MB of half ones, over ~600 MB of everything else, whose
    # own RSS moves by tens of MB between runs: loose bounds that still tell halved rows from not
    assert memory["fp32"]["table_rss_bytes_per_rank"][0] > 0.5 * memory["fp32"]["table_bytes_per_rank"]
    assert 0.2 < memory["fp16"]["table_rss_ratio_to_fp32"] < 0.85
    for dtype in ("fp32", "fp16"):  # the runs really stored their rows in the dtype they are filed under
        assert f"table_dtype: {dtype}" in (tmp_path / "memory" / f"1p-20000-{dtype}" / "config.yaml").read_text()
        assert f"table_dtype: {dtype}" in (tmp_path / "speed" / f"pf20-{dtype}-round0" / "config.yaml").read_text()

    speed = record["speed"]["pooling_20"]
    assert speed["fp32"]["ratio_to_fp32"] == 1.0
    for figures in speed.values():
        assert figures["samples_per_s"]["median"] > 0 and len(figures["samples_per_s"]["values"]) == 1
        assert {"lookup", "backward"} <= set(figures["median_round_breakdown_ms"])
    assert speed["fp16"]["ratio_to_fp32"] == pytest.approx(speed["fp16"]["samples_per_s"]["median"] / speed["fp32"]["samples_per_s"]["median"], abs=1e-3)
    assert speed["fp32"]["round_ratios_to_fp32"] == [1.0] and speed["fp16"]["median_round_ratio_to_fp32"] == speed["fp16"]["ratio_to_fp32"]  # one round

    criteo = record["quality"]["criteo"]
    assert criteo["fp32"]["steps"] == criteo["fp16"]["steps"] == 20
    assert all(0.5 < criteo[d]["auc"][0] < 1 for d in ("fp32", "fp16"))
    assert criteo["fp16"]["auc_minus_fp32"]["per_seed"] == [criteo["fp16"]["auc"][0] - criteo["fp32"]["auc"][0]]
    assert not any(tmp_path.glob("*/*/checkpoint"))  # removed after each run
