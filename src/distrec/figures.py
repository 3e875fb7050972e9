"""Figures: matplotlib without a display, and PNGs written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from distrec.io import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, output: Path) -> Path:
    """Write ``fig`` as a PNG to ``output`` (atomically) and release it."""
    with atomic_path(output) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    pyplot().close(fig)
    return output
