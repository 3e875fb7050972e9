"""The optimizer state Hotline stores beside each row's weights: which state, how wide, and
how a stored row of the tiers holds both (``RowLayout``).

A stored row is ``[weights (dim values), state...]``; this module names the state of each
embedding optimizer and cuts gathered rows into views of it, for the tiers (one process)
and the replicated hot table (distributed) alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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


def state_views(state: torch.Tensor, name: str, dim: int) -> dict[str, torch.Tensor]:
    """The optimizer state of rows, float32 [n, state floats], as views named like the optimizer's."""
    views, col = {}, 0
    for key, kind in ROW_STATE[name]:
        if kind == "scalar":
            views[key] = state[:, col]
            col += 1
        else:
            views[key] = state[:, col : col + dim]
            col += dim
    return views


@dataclass(frozen=True)
class RowLayout:
    """How one tensor row of the tiers stores an embedding row: its ``dim`` weights in the
    table's ``dtype``, then its optimizer state (``state_floats`` float32), so both move
    between tiers and files together.

    A stored row is ``width`` units of ``unit``. For a float32 table a unit is a float32:
    ``[weights, state]``. For a half table (fp16, bf16) a unit is 16 bits (int16, so that
    every copy moves bits, whatever they hold): one weight, or half of a state float, which
    starts at an even unit (one unit of padding after an odd ``dim``). Views (``weights``,
    ``state``) give the weights and the state back in their own dtypes.

    Example:
        >>> layout = RowLayout(dim=16, state_floats=1, dtype=torch.float16)   # row-wise Adagrad
        >>> layout.width, layout.row_bytes                                   # float32: 17, 68
        (18, 36)
    """

    dim: int
    state_floats: int
    dtype: torch.dtype = torch.float32

    @classmethod
    def of(cls, optimizer: str, dim: int, dtype: torch.dtype = torch.float32) -> RowLayout:
        """The layout of rows of ``dim`` weights of ``dtype`` with embedding optimizer ``optimizer``'s state."""
        return cls(dim, row_state_floats(optimizer, dim), dtype)

    @property
    def unit(self) -> torch.dtype:
        """The dtype of the stored rows' elements: float32, or int16 for a half table."""
        return torch.float32 if self.dtype == torch.float32 else torch.int16

    @property
    def numpy_unit(self) -> np.dtype:
        """``unit`` as a numpy dtype (of files and memory maps of rows)."""
        return np.dtype(np.float32 if self.unit == torch.float32 else np.int16)

    @property
    def units_per_float(self) -> int:
        """Units holding one float32 of state: 1, or 2 for a half table."""
        return 4 // self.numpy_unit.itemsize

    @property
    def state_start(self) -> int:
        """The unit the state starts at: ``dim`` rounded up to a whole float32."""
        return -(-self.dim // self.units_per_float) * self.units_per_float

    @property
    def width(self) -> int:
        """Units per stored row."""
        return self.state_start + self.state_floats * self.units_per_float

    @property
    def row_bytes(self) -> int:
        """Bytes per stored row."""
        return self.width * self.numpy_unit.itemsize

    def weights(self, rows: torch.Tensor) -> torch.Tensor:
        """The weights of stored rows [n, width or more] (or their first ``dim`` units), a [n, dim] view of ``dtype``."""
        return rows[:, : self.dim].view(self.dtype)

    def state(self, rows: torch.Tensor) -> torch.Tensor:
        """The optimizer state of stored rows [n, width], a float32 [n, state_floats] view."""
        return rows[:, self.state_start :].view(torch.float32)

    def empty(self, num_rows: int) -> torch.Tensor:
        """Stored rows [num_rows, width] on the host with zero state (weights to fill)."""
        rows = torch.empty(num_rows, self.width, dtype=self.unit)
        rows[:, self.dim :] = 0
        return rows
