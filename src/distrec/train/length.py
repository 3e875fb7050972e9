"""RunLength: the batch size, evaluation interval and length a run trains with, resolved
from its settings and its data; Position: where in that length training stands.

The user's config keeps what was given (an unset batch size stays unset); what the trainer
chose is this object, written beside it into the run directory (``resolved.json``, with
the optimizers), so a resumed run resolves it again from the same data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from distrec.config import MAX_EPOCHS, TrainConfig, auto_batch_size, auto_eval_every
from distrec.train.early_stopping import BestModel


@dataclass(frozen=True)
class RunLength:
    """How long a run trains, in optimizer steps of ``batch_size`` samples (global)."""

    batch_size: int
    steps_per_epoch: int
    total_steps: int
    """The most steps to train (``MAX_EPOCHS`` epochs when training until converged)."""
    eval_every: int
    """Steps between evaluations (0: at the end only)."""
    until_converged: bool
    """Whether early stopping decides the length (no epochs, no max steps, validation rows)."""
    fixed_by: str
    """What fixes a length that is not decided by early stopping: ``--max-steps`` or ``--epochs``."""

    def converged(self, best: BestModel) -> bool:
        """Whether a run without a fixed length went ``best.patience`` evaluations without a lower validation loss."""
        return self.until_converged and best.exhausted

    def done(self, step: int, best: BestModel) -> bool:
        """Whether a run at ``step`` reached its length or converged."""
        return step >= self.total_steps or self.converged(best)

    def stopping(self, best: BestModel) -> dict[str, Any]:
        """Why training stopped, and, without a fixed length, which step's model is reported."""
        if not self.until_converged:
            return {"stopped": f"reached {self.fixed_by}"}
        patience = best.patience
        why = f"no lower validation loss in {patience} evaluation{'s' if patience != 1 else ''}" if best.exhausted else f"reached {MAX_EPOCHS} epochs"
        return {"best_step": best.step, "stopped": why}


def resolve_length(t: TrainConfig, train_rows: int, val_rows: int, split: str) -> tuple[RunLength, list[str]]:
    """The run's length for ``train_rows`` training and ``val_rows`` validation rows, and one
    line per choice made for the user (to print): an unset batch size comes from the rows
    (``auto_batch_size``); without epochs or max steps the run trains until the validation loss
    stops improving, or one epoch when there is nothing to validate on."""
    notes = []
    batch_size = t.batch_size
    if batch_size is None:
        batch_size = auto_batch_size(train_rows)
        notes.append(f"batch size {batch_size} for {train_rows:,} training rows (--batch-size to choose)")
    steps_per_epoch = max(1, math.ceil(train_rows / batch_size))
    fixed_by = "--max-steps" if t.max_steps is not None else "--epochs"
    if t.max_steps is not None:
        return RunLength(batch_size, steps_per_epoch, t.max_steps, t.eval_every, False, fixed_by), notes
    if t.epochs is not None:
        return RunLength(batch_size, steps_per_epoch, t.epochs * steps_per_epoch, t.eval_every, False, fixed_by), notes
    if val_rows == 0:
        notes.append(f"no validation rows to stop on (split {split!r}): training 1 epoch; give --epochs or --max-steps")
        return RunLength(batch_size, steps_per_epoch, steps_per_epoch, t.eval_every, False, fixed_by), notes
    eval_every = t.eval_every or auto_eval_every(steps_per_epoch)
    notes.append(
        f"training until the validation loss stops improving for {t.patience} evaluations, one every {eval_every} steps "
        f"(at most {MAX_EPOCHS} epochs; --epochs or --max-steps for a fixed length)"
    )
    return RunLength(batch_size, steps_per_epoch, MAX_EPOCHS * steps_per_epoch, eval_every, True, fixed_by), notes


@dataclass
class Position:
    """Where training stands: optimizer steps done, and the position inside the epoch."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step, self.epoch, self.step_in_epoch = int(state["step"]), int(state["epoch"]), int(state["step_in_epoch"])
