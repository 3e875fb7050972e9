"""Simulator results as plain-text tables and as a PNG of weak-scaling efficiency."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from distrec.io import atomic_write_bytes


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None, digits: int = 2) -> str:
    """Rows of dicts as an aligned text table (floats to ``digits`` decimals).

    Example:
        >>> print(format_table([{"gpus": 16, "speedup": 1.234}, {"gpus": 512, "speedup": 2.0}]))
        gpus  speedup
          16     1.23
         512     2.00
    """
    if not rows:
        return ""
    columns = list(columns or rows[0])
    cells = [[_cell(row[c], digits) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def plot_efficiency(rows: Sequence[dict], schemes: Sequence[str], path: str | Path, title: str = "") -> None:
    """Write a PNG of weak-scaling efficiency vs GPUs (log2 axis), one panel per hardware and
    one line per scheme, from ``distrec.sim.scaling.scaling_table`` rows."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    hardware = list(dict.fromkeys(r["hardware"] for r in rows))
    fig = Figure(figsize=(4.2 * len(hardware), 4.0))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(hardware), sharey=True, squeeze=False)[0]
    for ax, name in zip(axes, hardware):
        mine = [r for r in rows if r["hardware"] == name]
        gpus = [r["gpus"] for r in mine]
        for scheme in schemes:
            ax.plot(gpus, [r[f"efficiency_{scheme}"] for r in mine], marker="o", markersize=3, label=scheme)
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus], fontsize=7, rotation=45)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.set_title(name)
        ax.set_xlabel("GPUs")
    axes[0].set_ylabel("weak-scaling efficiency")
    axes[-1].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buffer.getvalue())
