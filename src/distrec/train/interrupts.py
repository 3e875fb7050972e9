"""RunRequests: Ctrl-C and SIGTERM finish the step and save; a checkpoint every few minutes.

A signal during training only sets a flag: the step in flight finishes, and at the next
point where the ranks agree (every step in one process, every ``AGREE_EVERY`` steps on
several: a small all-reduce on the host, never on a GPU) every rank stops at the same step,
after the trainer saved a checkpoint. A second signal stops at once (the last checkpoint
stays intact). The same agreement tells the ranks when ``train.checkpoint_minutes`` have
passed since the last save, by rank 0's clock.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

AGREE_EVERY = 10
"""Steps between two agreements of the ranks on a stop or a save (a 2-integer all-reduce)."""


class StopRequested(KeyboardInterrupt):
    """Training stopped at a step boundary after a signal, its checkpoint saved."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signal.Signals(signum)


@dataclass(frozen=True)
class Agreed:
    """What every rank does after this step."""

    stop: int | None
    """The signal to stop for (None: go on)."""
    save: bool
    """Whether a checkpoint is due by time."""


class RunRequests:
    """The signals and save times of a run, agreed by its ranks (use it as a context: it
    handles SIGINT and SIGTERM inside the block, in the main thread only).

    Args:
        distributed: whether the run has several ranks (the agreement is then a collective).
        checkpoint_minutes: minutes between two checkpoints by time (0: none by time).
    """

    def __init__(self, distributed: bool, checkpoint_minutes: float) -> None:
        self.distributed = distributed
        self.checkpoint_seconds = checkpoint_minutes * 60.0
        self.signum: int | None = None
        self.last_save = time.monotonic()
        self._previous: dict[int, object] = {}
        # NCCL groups hold device tensors: the agreement runs on a host (gloo) group of its own
        self._group = dist.new_group(backend="gloo") if distributed and dist.get_backend() != "gloo" else None

    def __enter__(self) -> RunRequests:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._request)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous = {}

    def _request(self, signum: int, frame: object) -> None:
        if self.signum is not None:  # asked twice: stop now
            raise StopRequested(signum)
        self.signum = signum

    def saved(self) -> None:
        """Note that a checkpoint was just written."""
        self.last_save = time.monotonic()

    def agreed(self, step: int) -> Agreed:
        """After ``step``: whether to stop (some rank got a signal) and whether a checkpoint
        is due by time; a collective on several ranks every ``AGREE_EVERY`` steps."""
        save_due = self.checkpoint_seconds > 0 and time.monotonic() - self.last_save >= self.checkpoint_seconds
        if not self.distributed:
            return Agreed(self.signum, save_due)
        if step % AGREE_EVERY:
            return Agreed(None, False)
        flags = torch.tensor([self.signum or 0, int(save_due and dist.get_rank() == 0)], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group)
        stop, save = flags.tolist()
        return Agreed(stop or None, bool(save))
