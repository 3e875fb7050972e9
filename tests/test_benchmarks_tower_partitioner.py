"""The tower-partitioner benchmark's pieces that need no training: baselines, statistics, table."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tower_partitioner as tp  # noqa: E402


def test_random_towers_have_the_strided_sizes_and_depend_on_the_seed():
    towers = tp.random_towers(26, 4, seed=3)
    assert sorted(len(t) for t in towers) == [6, 6, 7, 7]
    assert sorted(f for t in towers for f in t) == list(range(26))
    assert tp.random_towers(26, 4, seed=3) == towers
    assert tp.random_towers(26, 4, seed=4) != towers


def test_rank_correlation_reads_only_the_off_diagonal_pairs():
    a = torch.rand(6, 6, generator=torch.Generator().manual_seed(0))
    a = a + a.T
    b = 2 * a + 5 * torch.eye(6)
    assert tp.rank_correlation(a, b) == pytest.approx(1.0)
    assert tp.rank_correlation(a, -a) == pytest.approx(-1.0)
    assert tp.interaction_agreement([a, b, -a]) == pytest.approx((1 - 1 - 1) / 3)
    assert tp.interaction_agreement([a]) is None


def test_summary_gives_mann_whitney_p_values_of_the_partitioners():
    rng = np.random.default_rng(0)
    auc = {"dlrm": list(0.70 + 0.001 * rng.standard_normal(10)), "tp": [0.75 + 0.001 * i for i in range(10)]}
    auc |= {"naive": [0.70 + 0.001 * i for i in range(10)], "random": [0.7505 + 0.001 * i for i in range(10)]}
    result = {"auc": auc, "towers": 4, "epochs": 1, "interaction_agreement": {"pairwise": 0.5, "cosine": None}, "pairwise_vs_untrained": 0.2}
    summary = tp.summarise(result)
    # all 10 tp AUCs above all 10 naive ones: U = 100; scipy's normal approximation with the
    # continuity correction (its choice for 10 + 10 samples): z = (100 - 50 - 0.5) / sqrt(10 * 10 * 21 / 12)
    z = 49.5 / math.sqrt(175)
    assert summary["p_value_vs_naive"] == pytest.approx(math.erfc(z / math.sqrt(2)))
    assert 0.5 < summary["p_value_vs_random"] <= 1  # interleaved with tp: no difference
    assert summary["paper_p_value_vs_naive"] is None
    assert summary["mean"]["tp"] == pytest.approx(0.7545)
    assert summary["sd"]["naive"] == pytest.approx(np.std(auc["naive"], ddof=1))
    row = tp.table_rows({"x": summary}, ["tp", "tp_paper", "naive"])[0]
    assert row["tp_paper"] == "-" and row["p_vs_naive"] == "0.000183" and row["rho_seeds"] == "0.50"
