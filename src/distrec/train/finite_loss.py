"""FiniteLossCheck: stop a run whose training loss became NaN, infinite or absurdly large
(``LARGEST_LOSS``), without reading the loss back from the device at every step.

The losses stay on the device until a check, which the trainer runs where it reads the
device anyway or must not go on: at the logging interval, before every checkpoint and
evaluation, and at most ``most_pending`` steps apart. A check is a collective on several
ranks (every rank stops at the same step) and one host sync.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distrec.errors import DistrecError

MOST_PENDING = 100
"""Steps at most between two checks: bounds the losses kept and the steps trained after a divergence."""

LARGEST_LOSS = 1e4
"""A mean binary cross-entropy above this is a diverged run even when finite: a loss near it
needs logits of about that size, where a constant prediction of the click rate scores below 1."""


class FiniteLossCheck:
    """The training losses since the last check (0-dim tensors on the device), and their check."""

    def __init__(self, distributed: bool, most_pending: int = MOST_PENDING) -> None:
        self.distributed = distributed
        self.most_pending = most_pending
        self.pending: list[torch.Tensor] = []
        self.first_step = 0  # the step of pending[0] (1-based, as the progress counts steps)

    def add(self, loss: torch.Tensor, step: int) -> bool:
        """Keep the loss of ``step``; whether a check is due (``most_pending`` losses kept)."""
        if not self.pending:
            self.first_step = step
        self.pending.append(loss.detach().reshape(1))
        return len(self.pending) >= self.most_pending

    def check(self, lr: float, saved_step: int | None) -> None:
        """Raise DistrecError naming the first step whose loss was not finite on some rank (a
        collective when distributed); ``lr`` and ``saved_step`` (the newest checkpoint's step,
        None if none) go into the message."""
        if not self.pending:
            return
        losses = torch.cat(self.pending)
        self.pending = []
        finite = (torch.isfinite(losses) & (losses.abs() <= LARGEST_LOSS)).to(torch.int32)
        if self.distributed:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        flags = finite.tolist()
        if all(flags):
            return
        first = flags.index(0)
        saved = f"the last checkpoint (step {saved_step}) is kept" if saved_step is not None else "no checkpoint was written"
        raise DistrecError(
            f"the training loss became {float(losses[first])} at step {self.first_step + first}; training diverged, lower the learning rate "
            f"(--lr, now {lr}) and retrain; {saved}"
        )
