"""What Hotline can gain on a data set: popularity versus hot budget, logger recall, throughput.

``popularity_curve`` is the analogue of the paper's Figure 6 (Adnan et al., ISCA 2024): for
each fast-tier budget, the fraction of inputs that are popular (every index hot) and the
fraction of lookups served hot, with the hot set chosen two ways: by exact counts of the
whole stream (the best any logger could do) and by the access logger as training runs it
(sampled mini-batches, bounded memory). ``plot_popularity`` and ``plot_recall`` draw them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from distrec.data.batch import Batch
from distrec.hotline.access_logger import AccessLogger, ExactCounter
from distrec.hotline.hot_set import sample_of_lookups
from distrec.hotline.rows import RowSpace

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


def _fraction_plot(lines: list[tuple[Sequence[float], Sequence[float], dict]], xlabel: str, ylabel: str, title: str, path: str | Path) -> None:
    """Lines ``(x, y, matplotlib style)`` of fractions over a log-scale x axis, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
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
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_popularity(curve: dict, path: str | Path, title: str) -> None:
    """Popular-input and hot-lookup fractions versus the hot budget (log scale) as a PNG."""
    mib = np.asarray(curve["budgets_bytes"]) / 2**20
    lines = []
    for name, style in (("exact", "-"), ("logger", "--")):
        c = curve[name]
        lines.append((mib, c["popular_fraction"], dict(linestyle=style, color="#48c", marker="o", label=f"popular inputs ({name} counts)")))
        lines.append((mib, c["hot_lookup_fraction"], dict(linestyle=style, color="#c84", marker=".", label=f"lookups served hot ({name} counts)")))
    _fraction_plot(lines, "hot budget (MiB)", "fraction", title, path)


def plot_recall(results: list[dict], k: int, path: str | Path, title: str) -> None:
    """The logger's recall of the true top-``k`` rows versus its memory, one line per sample rate."""
    lines = []
    for rate in sorted({r["sample_rate"] for r in results}):
        points = sorted((r["logger_bytes"] / 2**10, r["recall"]) for r in results if r["sample_rate"] == rate)
        lines.append(([p[0] for p in points], [p[1] for p in points], dict(marker="o", label=f"sample rate {rate:g}")))
    _fraction_plot(lines, "logger memory (KiB)", f"recall of the top {k} rows", title, path)
