"""Reuse-factor histograms and table statistics measured from index streams."""

from pathlib import Path

import numpy as np
import pytest

from distrec.errors import DistrecError
from distrec.planner.features import TABLE_FEATURE_NAMES, feature_matrix, reuse_bin, reuse_histogram, table_spec_from_indices
from distrec.planner.indices import sample_bags
from distrec.planner.table_pool import PUBLISHED_HISTOGRAMS, parse_locality_histograms
from distrec.planner.types import TableSpec

LOCALITY_STATS = Path(__file__).resolve().parents[2] / "shared" / "data" / "dlrm_datasets" / "locality_stats_2021_t856.txt"


def test_bins_double_from_one_to_32768_then_overflow():
    counts = np.array([1, 2, 3, 4, 5, 8, 9, 16384, 16385, 32768, 32769, 10**6])
    assert reuse_bin(counts).tolist() == [0, 1, 2, 2, 3, 3, 4, 14, 15, 15, 16, 16]


def test_histogram_counts_distinct_rows_or_accesses():
    stream = np.array([5, 5, 5, 7, 9, 9, 1, 5])  # row 5 x4, row 9 x2, rows 7 and 1 x1
    rows = reuse_histogram(stream)
    assert rows[:3].tolist() == [0.5, 0.25, 0.25] and rows.sum() == 1.0
    accesses = reuse_histogram(stream, weight_by_accesses=True)
    assert accesses[:3].tolist() == [2 / 8, 2 / 8, 4 / 8]


def test_counts_restart_in_every_window():
    stream = np.array([3, 3, 3, 3])
    assert reuse_histogram(stream)[2] == 1.0  # one row accessed 4 times
    assert reuse_histogram(stream, window_ids=np.array([0, 0, 1, 1]))[1] == 1.0  # twice per window


def test_table_spec_from_jagged_stream():
    values = np.array([0, 1, 1, 2, 2, 2, 4])
    offsets = np.array([0, 2, 3, 6, 7])  # 4 samples, batches of 2 samples
    spec = table_spec_from_indices("f", values, offsets, num_rows=5, dim=8, batch_size=2)
    assert spec.pooling_factor == 7 / 4
    # batch 0: rows 0 (x1), 1 (x2); batch 1: rows 2 (x3), 4 (x1)
    assert spec.histogram[:3] == (0.5, 0.25, 0.25)
    with pytest.raises(DistrecError, match="outside"):
        table_spec_from_indices("f", values, offsets, num_rows=4, dim=8, batch_size=2)
    with pytest.raises(DistrecError, match="offsets"):
        table_spec_from_indices("f", values, np.array([0, 2, 1, 7]), num_rows=5, dim=8, batch_size=2)


def test_sampled_bags_follow_pooling_factor_and_histogram():
    hist = (0.5, 0.3, 0.2) + (0.0,) * 14
    table = TableSpec("t", 1_000_000, 16, 12.0, hist)
    values, offsets = sample_bags(table, 4096, np.random.default_rng(0))
    assert offsets.size == 4097 and offsets[-1] == values.size
    assert values.size / 4096 == pytest.approx(12.0, rel=0.05)
    assert reuse_histogram(values)[:3] == pytest.approx(hist[:3], abs=0.02)


def test_feature_matrix_columns():
    t = TableSpec("t", 1024, 32, 3.0, (1.0,) + (0.0,) * 16)
    row = feature_matrix([t])[0]
    assert row.shape == (len(TABLE_FEATURE_NAMES),)
    assert row[:6].tolist() == [32.0, 10.0, 3.0, 17.0, 96.0, 1.0]  # log2(1024 * 32 * 4) = 17; 32 x 3 floats per sample


@pytest.mark.skipif(not LOCALITY_STATS.is_file(), reason="the shared dlrm_datasets locality stats are not present")
def test_published_histograms_match_the_locality_stats_file():
    parsed = parse_locality_histograms(LOCALITY_STATS)
    assert parsed.shape[1] == 17
    unique = np.unique(parsed, axis=0)
    assert sorted(map(tuple, unique)) == sorted(map(tuple, PUBLISHED_HISTOGRAMS))
