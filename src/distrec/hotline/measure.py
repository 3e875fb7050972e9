"""What Hotline can gain on a data set: popularity versus hot budget, logger recall, throughput.

``popularity_curve`` is the analogue of the paper's Figure 6 (Adnan et al., ISCA 2024): for
each fast-tier budget, the fraction of inputs that are popular (every index hot) and the
fraction of lookups served hot, with the hot set chosen two ways: by exact counts of the
whole stream (the best any logger could do) and by the access logger as training runs it
(sampled mini-batches, bounded memory). ``plot_popularity`` and ``plot_recall`` draw them;
``logger_size_figure`` draws the logger's recall versus its memory for several streams (the
paper's Fig. 27), ``systems_figure`` and ``popular_fraction_figure`` what
``benchmarks/hotline.py`` measures: speed and disk reads per system, and the popular fraction
over time as the hot set is re-learned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from distrec.data.batch import Batch
from distrec.hotline.access_logger import AccessLogger, ExactCounter
from distrec.hotline.hot_set import sample_of_lookups
from distrec.hotline.rows import RowSpace

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NEVER_HOT = np.iinfo(np.int64).max  # rank of a row the ranking does not hold


def _ranks(ranked_ids: np.ndarray, total_rows: int) -> np.ndarray:
    """int64 [total_rows]: each row's position in ``ranked_ids`` (NEVER_HOT when absent)."""
    rank = np.full(total_rows, NEVER_HOT, dtype=np.int64)
    rank[ranked_ids] = np.arange(ranked_ids.size)
    return rank


def popularity_curve(batches: Iterable[Batch], space: RowSpace, row_bytes: int, budgets_bytes: Sequence[int], logger: AccessLogger) -> dict:
    """Popular-input and hot-lookup fractions of a stream of mini-batches per fast-tier budget.

    A budget of ``b`` bytes holds the ``b // row_bytes`` top-ranked rows. The ``exact``
    ranking counts every lookup of the stream; the ``logger`` ranking is what ``logger``
    (fresh) holds after observing the stream with its sample rate. Memory: 8 bytes per
    row of all tables plus 16 bytes per lookup of the stream.

    Returns:
        ``budgets_bytes``, ``hot_rows``, ``samples``, ``lookups``, ``distinct_rows`` and
        for ``exact`` and ``logger``: ``popular_fraction`` and ``hot_lookup_fraction``,
        lists parallel to the budgets.
    """
    exact = ExactCounter(space.total_rows)
    lookups, sample_ids = [], []
    samples = 0
    for batch in batches:
        ids = space.batch_ids(batch).cpu()
        exact.record(ids)
        logger.observe(ids)
        lookups.append(ids.numpy())
        sample_ids.append(sample_of_lookups(batch).cpu().numpy() + samples)
        samples += batch.batch_size
    ids = np.concatenate(lookups) if lookups else np.zeros(0, np.int64)
    sample_of = np.concatenate(sample_ids) if sample_ids else np.zeros(0, np.int64)
    hot_rows = [int(b) // row_bytes for b in budgets_bytes]
    result: dict = {
        "budgets_bytes": [int(b) for b in budgets_bytes],
        "hot_rows": hot_rows,
        "samples": samples,
        "lookups": int(ids.size),
        "distinct_rows": int(np.count_nonzero(exact.per_row)),
    }
    for name, ranked in (("exact", exact.top(space.total_rows)), ("logger", logger.top(space.total_rows))):
        rank = _ranks(ranked, space.total_rows)[ids]
        worst = np.full(samples, -1, dtype=np.int64)  # a sample without lookups is always popular
        np.maximum.at(worst, sample_of, rank)
        sorted_rank = np.sort(rank)
        result[name] = {
            "popular_fraction": [float(np.mean(worst < k)) if samples else 0.0 for k in hot_rows],
            "hot_lookup_fraction": [float(np.searchsorted(sorted_rank, k) / max(1, ids.size)) for k in hot_rows],
        }
    return result


def batch_ids(batches: Iterable[Batch], space: RowSpace) -> list[np.ndarray]:
    """The global row ids of every mini-batch, as int64 arrays (the input of ``measure_recall``)."""
    return [space.batch_ids(batch).cpu().numpy() for batch in batches]


def default_top_k(batches: Sequence[np.ndarray], hot_rows: int) -> int:
    """How many top rows the recall measurement asks for: the budget's hot rows, at most a
    tenth of the distinct rows of the stream (so the question is not trivially 'all rows')."""
    distinct = np.unique(np.concatenate(batches)).size if batches else 0
    return max(1, min(hot_rows, distinct // 10))


def _figure(width: float, height: float) -> Figure:
    """A matplotlib Figure drawn without pyplot or a display."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _fraction_plot(lines: list[tuple[Sequence[float], Sequence[float], dict]], xlabel: str, ylabel: str, title: str, path: str | Path) -> None:
    """Lines ``(x, y, matplotlib style)`` of fractions over a log-scale x axis, saved as a PNG."""
    from distrec.figures import save_figure

    fig = _figure(6, 4)
    ax = fig.subplots()
    for x, y, style in lines:
        ax.plot(x, y, **style)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, Path(path))


def plot_popularity(curve: dict, path: str | Path, title: str) -> None:
    """Popular-input and hot-lookup fractions versus the hot budget (log scale) as a PNG."""
    mib = np.asarray(curve["budgets_bytes"]) / 2**20
    lines = []
    for name, style in (("exact", "-"), ("logger", "--")):
        c = curve[name]
        lines.append((mib, c["popular_fraction"], dict(linestyle=style, color="#48c", marker="o", label=f"popular inputs ({name} counts)")))
        lines.append((mib, c["hot_lookup_fraction"], dict(linestyle=style, color="#c84", marker=".", label=f"lookups served hot ({name} counts)")))
    _fraction_plot(lines, "hot budget (MiB)", "fraction", title, path)


def logger_size_figure(results_by_stream: Mapping[str, list[dict]], marks_bytes: Mapping[str, int] | None = None) -> Figure:
    """The logger's recall of the true top-``k`` rows (top row of panels) and the accesses its
    top ``k`` serve relative to the true top ``k``'s (bottom row) versus its memory (log
    scale), one column per stream (``measure_recall`` results), one line per (k, sample
    rate); dotted, the same for a logger of unbounded memory (exact counts of the same
    sampled mini-batches); dashed verticals at ``marks_bytes`` (name -> bytes)."""
    streams = list(results_by_stream.items())
    fig = _figure(5.0 * len(streams), 7.0)
    axes = fig.subplots(2, len(streams), squeeze=False)
    metrics = (("recall", "recall of the true top k rows"), ("access_coverage", "accesses served, of the true top k's"))
    for col, (title, results) in enumerate(streams):
        for row, (metric, ylabel) in enumerate(metrics):
            ax = axes[row][col]
            for i, (k, rate) in enumerate(sorted({(r["k"], r["sample_rate"]) for r in results})):
                points = sorted((r["logger_bytes"], r[metric], r[f"unbounded_{metric}"]) for r in results if (r["k"], r["sample_rate"]) == (k, rate))
                mib = [p[0] / 2**20 for p in points]
                ax.plot(mib, [p[1] for p in points], marker="o", color=f"C{i}", label=f"top {k:,}, sample rate {rate:g}")
                ax.plot([mib[0], mib[-1]], [points[0][2]] * 2, linestyle=":", color=f"C{i}", label="  unbounded logger")
            for name, nbytes in (marks_bytes or {}).items():
                ax.axvline(nbytes / 2**20, color="#888", linestyle="--", linewidth=1)
                ax.annotate(name, (nbytes / 2**20, 0.98), xycoords=("data", "axes fraction"), rotation=90, fontsize=7, color="#555", ha="right", va="top")
            ax.set_xscale("log")
            if metric == "recall":
                ax.set_ylim(0, 1.02)
            else:  # often all near 1: zoomed, but never to less than 0.95-1
                ax.set_ylim(min(0.95, ax.get_ylim()[0]), 1.002)
            ax.set_xlabel("logger memory (MiB)")
            ax.set_ylabel(ylabel)
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_recall(results: list[dict], path: str | Path, title: str, marks_bytes: Mapping[str, int] | None = None) -> Path:
    """``logger_size_figure`` of one stream's ``measure_recall`` results, as a PNG (atomically)."""
    from distrec.figures import save_figure

    return save_figure(logger_size_figure({title: results}, marks_bytes), Path(path))


def systems_figure(systems: Mapping[str, Mapping[str, float]]) -> Figure:
    """Per system (name -> figures with ``samples_per_s`` and ``disk_read_kib_per_step``), its
    training samples/s (left) and the bytes it read from disk per step (right), as bars."""
    fig = _figure(10.0, 4.0)
    speed, disk = fig.subplots(1, 2)
    names = [name.replace("_", " ") for name in systems]
    colors = [f"C{i}" for i in range(len(names))]
    speed.bar(names, [s["samples_per_s"] for s in systems.values()], color=colors)
    speed.set_ylabel("training samples/s")
    disk.bar(names, [s["disk_read_kib_per_step"] for s in systems.values()], color=colors)
    disk.set_ylabel("KiB read from disk per step")
    for ax in (speed, disk):
        ax.set_xlabel("system")
        ax.tick_params(axis="x", labelsize=8, rotation=15)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def popular_fraction_figure(popular_fraction: Sequence[float], relearn_steps: Sequence[int], shift_steps: Sequence[int] = ()) -> Figure:
    """The popular fraction of every mini-batch (x: its step, from 1) with the re-learning
    points (solid verticals, after that step) and the popularity shifts (dashed) marked."""
    fig = _figure(8.0, 4.0)
    ax = fig.subplots()
    ax.plot(np.arange(1, len(popular_fraction) + 1), popular_fraction, marker=".", linewidth=1, label="popular inputs of the mini-batch")
    for i, step in enumerate(relearn_steps):
        ax.axvline(step + 0.5, color="#2a2", linewidth=1, label="hot set re-learned" if i == 0 else None)
    for i, step in enumerate(shift_steps):
        ax.axvline(step + 0.5, color="#c44", linestyle="--", linewidth=1.5, label="popular rows moved" if i == 0 else None)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("mini-batch")
    ax.set_ylabel("fraction of inputs popular")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
