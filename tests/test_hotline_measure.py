import numpy as np
import pytest

from distrec.figures import save_figure
from distrec.hotline.access_logger import AccessLogger, measure_recall
from distrec.hotline.measure import (
    batch_ids,
    default_top_k,
    logger_size_figure,
    plot_popularity,
    plot_recall,
    popular_fraction_figure,
    popularity_curve,
    systems_figure,
)
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


def labelled(fig) -> bool:
    return all(ax.get_xlabel() and ax.get_ylabel() for ax in fig.axes)


def test_recall_versus_logger_size_draws_every_k_and_its_unbounded_line(tmp_path):
    stream = [np.arange(i, i + 50) % 64 for i in range(20)]
    results = measure_recall(stream, 64, ks=[4, 8], capacities_bytes=[64, 1024], sample_rates=[1.0])
    fig = logger_size_figure({"a": results, "b": results}, {"paper": 4 << 20})
    assert len(fig.axes) == 4 and labelled(fig)
    recall_lines = fig.axes[0].get_lines()  # per k: the logger's line, then the unbounded logger's
    for line, k in zip(recall_lines[::2], (4, 8)):
        mine = sorted((r["logger_bytes"], r["recall"]) for r in results if r["k"] == k)
        np.testing.assert_allclose(line.get_xdata(), [b / 2**20 for b, _ in mine])
        np.testing.assert_allclose(line.get_ydata(), [r for _, r in mine])
    unbounded = next(r["unbounded_recall"] for r in results if r["k"] == 8)
    np.testing.assert_allclose(recall_lines[3].get_ydata(), [unbounded, unbounded])
    coverage = fig.axes[2].get_lines()[0].get_ydata()  # row 2, column 1
    np.testing.assert_allclose(coverage, [r["access_coverage"] for r in sorted(results, key=lambda r: r["logger_bytes"]) if r["k"] == 4])
    assert plot_recall(results, tmp_path / "recall.png", "t").read_bytes()[:4] == b"\x89PNG"


def test_systems_figure_draws_speed_and_disk_reads_per_system(tmp_path):
    systems = {"in_memory": {"samples_per_s": 30.0, "disk_read_kib_per_step": 0.0}, "hotline": {"samples_per_s": 20.0, "disk_read_kib_per_step": 5.5}}
    fig = systems_figure(systems)
    speed, disk = fig.axes
    assert [p.get_height() for p in speed.patches] == [30.0, 20.0]
    assert [p.get_height() for p in disk.patches] == [0.0, 5.5]
    assert [t.get_text() for t in speed.get_xticklabels()] == ["in memory", "hotline"]
    assert labelled(fig)
    assert save_figure(fig, tmp_path / "systems.png").read_bytes()[:4] == b"\x89PNG"


def test_popular_fraction_figure_marks_relearning_and_shifts(tmp_path):
    fractions = [0.0, 0.0, 0.5, 0.6, 0.1, 0.5]
    fig = popular_fraction_figure(fractions, relearn_steps=[2, 4], shift_steps=[4])
    (ax,) = fig.axes
    series, *verticals = ax.get_lines()
    np.testing.assert_array_equal(series.get_xdata(), [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(series.get_ydata(), fractions)
    assert [(v.get_xdata()[0], v.get_linestyle()) for v in verticals] == [(2.5, "-"), (4.5, "-"), (4.5, "--")]
    assert labelled(fig)
    assert save_figure(fig, tmp_path / "drift.png").read_bytes()[:4] == b"\x89PNG"
