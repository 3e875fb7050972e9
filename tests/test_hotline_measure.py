import numpy as np
import pytest

from distrec.hotline.access_logger import AccessLogger
from distrec.hotline.measure import batch_ids, default_top_k, plot_popularity, popularity_curve
from test_hotline_hot_set import SPACE, make_batch

# rows a{1, 2, 3}, b{0, 5} = global 1, 2, 3, 10, 15; counts 2, 3, 1, 3, 1
BATCH = make_batch([[[1], [1, 2], [3], [], [2, 2]], [[0], [0], [0], [], [5]]])


def test_popular_and_hot_lookup_fractions_follow_the_ranking():
    logger = AccessLogger(capacity_bytes=256, total_rows=SPACE.total_rows, sample_rate=1.0, ways=64)
    curve = popularity_curve([BATCH], SPACE, row_bytes=10, budgets_bytes=[0, 19, 30, 40, 50], logger=logger)
    assert curve["hot_rows"] == [0, 1, 3, 4, 5]
    assert (curve["samples"], curve["lookups"], curve["distinct_rows"]) == (5, 10, 5)
    # ranking 2, 10, 1, 3, 15; sample 3 touches nothing, so it is always popular
    for name in ("exact", "logger"):
        assert curve[name]["popular_fraction"] == pytest.approx([0.2, 0.2, 0.6, 0.8, 1.0])
        assert curve[name]["hot_lookup_fraction"] == pytest.approx([0.0, 0.3, 0.8, 0.9, 1.0])


def test_a_logger_that_samples_nothing_makes_nothing_hot():
    logger = AccessLogger(capacity_bytes=256, total_rows=SPACE.total_rows, sample_rate=1e-9)
    curve = popularity_curve([BATCH, BATCH], SPACE, row_bytes=1, budgets_bytes=[100], logger=logger)
    assert curve["logger"]["popular_fraction"] == [0.2]  # only the empty samples
    assert curve["exact"]["popular_fraction"] == [1.0]


def test_default_top_k_is_at_most_a_tenth_of_the_rows_seen():
    ids = batch_ids([BATCH], SPACE)
    assert [a.tolist() for a in ids] == [[1, 1, 2, 3, 2, 2, 10, 10, 10, 15]]
    assert default_top_k([np.arange(100)], hot_rows=1000) == 10
    assert default_top_k([np.arange(100)], hot_rows=3) == 3


def test_the_curve_is_drawn(tmp_path):
    logger = AccessLogger(capacity_bytes=256, total_rows=SPACE.total_rows, sample_rate=1.0)
    curve = popularity_curve([BATCH], SPACE, row_bytes=10, budgets_bytes=[10, 100], logger=logger)
    plot_popularity(curve, tmp_path / "curve.png", "test")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
