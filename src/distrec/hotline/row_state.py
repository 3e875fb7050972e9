"""The optimizer state Hotline stores beside each row's weights: which state, how wide.

A stored row is ``[weights (dim floats), state...]``; this module names the state of each
embedding optimizer and cuts gathered rows into views of it, for the tiers (one process)
and the replicated hot table (distributed) alike.
"""

from __future__ import annotations

import torch

from distrec.errors import DistrecError

# Per-row optimizer state stored after the weights, as (state key, floats per row); a
# width of 1 is a per-row scalar (a 1-D state in distrec.components.optim), "dim" a vector.
ROW_STATE: dict[str, tuple[tuple[str, str], ...]] = {
    "sgd": (),
    "adagrad": (("sum", "scalar"),),
    "adam": (("exp_avg", "dim"), ("exp_avg_sq", "dim")),
}
STEP_KEY = "step"  # lazy Adam's step count: one per optimizer, not per row


def row_state_floats(name: str, dim: int) -> int:
    """Floats of optimizer state stored with each row for optimizer ``name``."""
    if name not in ROW_STATE:
        raise DistrecError(f"embedding optimizer {name!r} is unknown; choose one of: {', '.join(ROW_STATE)}")
    return sum(1 if kind == "scalar" else dim for _, kind in ROW_STATE[name])


def state_views(rows: torch.Tensor, name: str, dim: int) -> dict[str, torch.Tensor]:
    """The optimizer state of gathered rows [n, dim + state] as views named like the optimizer's."""
    views, col = {}, dim
    for key, kind in ROW_STATE[name]:
        if kind == "scalar":
            views[key] = rows[:, col]
            col += 1
        else:
            views[key] = rows[:, col : col + dim]
            col += dim
    return views
