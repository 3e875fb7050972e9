"""``distrec report``: a stacked-bar PNG of per-iteration time breakdowns of one or more runs."""

from __future__ import annotations

import json
from pathlib import Path

from distrec.errors import DistrecError
from distrec.train.breakdown import COMPONENTS

BREAKDOWN_FILE = "breakdown.json"


def load_breakdown(run_dir: Path) -> dict:
    path = Path(run_dir) / BREAKDOWN_FILE
    if not path.is_file():
        raise DistrecError(f"{str(path)!r} not found; pass the --out directory of a finished 'distrec train' run")
    return json.loads(path.read_text())


def plot_breakdowns(run_dirs: list[Path], output: Path, statistic: str = "median_ms") -> Path:
    """Draw one stacked bar per run (ms per iteration by component) into ``output`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(Path(d), load_breakdown(Path(d))) for d in run_dirs]
    labels = [b.get("label") or d.name for d, b in runs]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(runs) + 2.5), 4.5))
    bottom = [0.0] * len(runs)
    colors = plt.get_cmap("tab10")
    for i, name in enumerate(COMPONENTS):
        values = [b["components"].get(name, {}).get(statistic, 0.0) for _, b in runs]
        ax.bar(labels, values, bottom=bottom, label=name.replace("_", " "), color=colors(i))
        bottom = [x + v for x, v in zip(bottom, values)]
    ax.set_ylabel(f"ms per iteration ({statistic.split('_')[0]})")
    ax.set_title("Per-iteration time breakdown")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output
