"""Plain-text tables of simulator results."""

from __future__ import annotations

from collections.abc import Sequence


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
