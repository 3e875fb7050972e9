"""``distrec report``: plots of runs, each labelled by its run directory: a stacked bar of each
run's per-iteration time breakdown (``breakdown.json``), and training loss and validation AUC
over steps (``metrics.jsonl``), the runs overlaid."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from distrec.components.breakdown import COMPONENTS
from distrec.errors import DistrecError
from distrec.figures import pyplot, save_figure
from distrec.io import read_json
from distrec.train.run import BREAKDOWN_FILE, METRICS_FILE

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def run_labels(run_dirs: list[Path]) -> list[str]:
    """One distinct label per run directory: its name, or, where names repeat, as many of its
    last path parts as tell it apart (``a/round0``, ``b/round0``, ``c``)."""
    paths = [Path(os.path.abspath(d)) for d in run_dirs]
    for i, path in enumerate(paths):
        if path in paths[:i]:
            raise DistrecError(f"run directory {str(run_dirs[i])!r} is given twice; pass each run once")
    depths = [1] * len(paths)
    while True:  # ends: distinct absolute paths differ within their full depth
        labels = [Path(*p.parts[-d:]).as_posix() for p, d in zip(paths, depths)]
        clashing = {label for label in labels if labels.count(label) > 1}
        if not clashing:
            return labels
        depths = [d + (label in clashing) for d, label in zip(depths, labels)]


def check_runs(run_dirs: list[Path]) -> list[Path]:
    """DistrecError naming the first directory with nothing to plot: neither ``breakdown.json``
    nor a ``metrics.jsonl`` with a training loss or validation AUC. Returns the runs with a
    breakdown whose metrics log draws no curve (empty, or only other records so far)."""
    without_curves = []
    for d in map(Path, run_dirs):
        has_breakdown, has_metrics = (d / BREAKDOWN_FILE).is_file(), (d / METRICS_FILE).is_file()
        if not has_breakdown and not has_metrics:
            raise DistrecError(f"{str(d)!r} holds neither {BREAKDOWN_FILE} nor {METRICS_FILE}; pass the --out directory of a 'distrec train' run")
        if has_metrics and not any(curve_points(d).values()):
            if not has_breakdown:
                raise DistrecError(
                    f"{str(d / METRICS_FILE)!r} holds no training loss or validation AUC and {str(d)!r} no {BREAKDOWN_FILE}, so nothing to plot; "
                    "pass a run that has logged a step"
                )
            without_curves.append(d)
    return without_curves


def breakdown_figure(run_dirs: list[Path], statistic: str = "median_ms") -> Figure | None:
    """One horizontal stacked bar per run holding ``breakdown.json`` (ms per iteration by
    component, ``statistic`` ``median_ms`` or ``mean_ms``), top to bottom in the given order;
    None when no run has one. The figure's height grows with the number of runs."""
    labels = dict(zip(map(Path, run_dirs), run_labels(run_dirs)))
    runs = [(labels[d], _breakdown(d)) for d in labels if (d / BREAKDOWN_FILE).is_file()]
    if not runs:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9.0, 1.6 + 0.45 * len(runs)))
    names = [label for label, _ in runs]
    left = [0.0] * len(runs)
    colors = plt.get_cmap("tab10")
    for i, component in enumerate(COMPONENTS):
        values = [b["components"].get(component, {}).get(statistic, 0.0) for _, b in runs]
        ax.barh(names, values, left=left, label=component.replace("_", " "), color=colors(i))
        left = [x + v for x, v in zip(left, values)]
    ax.invert_yaxis()  # the first run on top
    ax.set_xlabel(f"ms per iteration ({statistic.split('_')[0]})")
    ax.set_title("Per-iteration time breakdown")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


CURVES = (("train", "loss"), ("val", "auc"))  # (split, key) of the records each panel draws


def curve_points(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The (step, value) points of each curve (``loss``, ``auc``) in a run's metrics log; none without one."""
    path = Path(run_dir) / METRICS_FILE
    records = _records(path) if path.is_file() else []
    return {key: [(r["step"], r[key]) for r in records if r.get("split") == split and key in r and "step" in r] for split, key in CURVES}


def curves_figure(run_dirs: list[Path]) -> Figure | None:
    """Training loss and validation AUC over steps, one line per run whose ``metrics.jsonl``
    holds either (left and right axes); None when no run's does."""
    labels = dict(zip(map(Path, run_dirs), run_labels(run_dirs)))
    runs = [(labels[d], points) for d in labels if any((points := curve_points(d)).values())]
    if not runs:
        return None
    plt = pyplot()
    fig, (loss_ax, auc_ax) = plt.subplots(1, 2, figsize=(12.0, 4.5))
    colors = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    for i, (label, points) in enumerate(runs):
        for ax, (_, key) in zip((loss_ax, auc_ax), CURVES):
            if points[key]:
                ax.plot(*zip(*points[key]), label=label, color=colors(i % colors.N), marker="o" if len(points[key]) < 20 else None, markersize=3)
    for ax, title, ylabel in ((loss_ax, "Training loss", "loss"), (auc_ax, "Validation AUC", "AUC")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    lines = {line.get_label(): line for ax in (loss_ax, auc_ax) for line in ax.get_lines()}  # one entry per run, from either panel
    auc_ax.legend(list(lines.values()), list(lines), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def _breakdown(run_dir: Path) -> dict:
    fix = "pass the --out directory of a finished 'distrec train' run"
    return read_json(run_dir / BREAKDOWN_FILE, "time breakdown", fix, fix)  # type: ignore[return-value]


def _records(path: Path) -> list[dict]:
    """The records of a metrics log; DistrecError naming a line that is not JSON."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise DistrecError(f"{str(path)!r} line {number} is not JSON; the run's metrics log is damaged, remove that line") from None
    return records


def plot_breakdowns(run_dirs: list[Path], output: Path, statistic: str = "median_ms") -> Path:
    """Draw one stacked bar per run (see ``breakdown_figure``) into ``output`` (PNG); every run
    must hold ``breakdown.json``."""
    paths = [Path(d) for d in run_dirs]
    for d in paths:
        _breakdown(d)  # DistrecError when missing
    return save_figure(breakdown_figure(paths, statistic), output)
