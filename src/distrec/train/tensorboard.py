"""TensorBoard event files of a run (``distrec train --tensorboard``): the records of its
metrics log as scalars, and the step timings that the log leaves out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distrec.components.breakdown import COMPONENTS
from distrec.errors import DistrecError

RECORD_KEYS = ("step", "epoch", "split", "rows")  # entries of a metrics record that are not plotted


def require_tensorboard() -> None:
    """DistrecError naming the fix when the optional ``tensorboard`` package is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise DistrecError("--tensorboard needs the tensorboard package; install it with pip install 'distrec[tensorboard]'") from None


class TensorBoardSink:
    """Scalars of one run in ``directory``, written by rank 0.

    Tags: ``SPLIT/NAME`` for every number of a metrics record (``train/loss``,
    ``train/popular_fraction``, ``val/auc``, ``test/logloss``, ...), ``speed/samples_per_s``
    and ``breakdown_ms/COMPONENT``, at the record's step.

    Args:
        directory: where the event files go (created).
        resume_after: the step of the checkpoint a resumed run continues from: what the
            interrupted run wrote after it is hidden (TensorBoard's ``purge_step``). None: a
            new run, whose directory's earlier event files are removed.
    """

    def __init__(self, directory: Path, resume_after: int | None) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        if resume_after is None:
            for old in Path(directory).glob("events.out.tfevents.*"):
                old.unlink()
        self.writer = SummaryWriter(str(directory), purge_step=None if resume_after is None else resume_after + 1)

    def record(self, record: dict[str, Any]) -> None:
        """The numbers of one metrics record (``step`` and ``split`` required), under ``split/``."""
        for name, value in record.items():
            if name not in RECORD_KEYS and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(f"{record['split']}/{name}", value, record["step"])
        self.writer.flush()

    def timings(self, step: int, samples_per_s: float, steps_ms: list[dict[str, float]]) -> None:
        """Training speed (samples/s) and the mean ms per breakdown component over ``steps_ms``
        (the ``StepTimer`` steps since the previous call) at ``step``."""
        self.writer.add_scalar("speed/samples_per_s", samples_per_s, step)
        for name in COMPONENTS if steps_ms else ():
            self.writer.add_scalar(f"breakdown_ms/{name}", sum(s.get(name, 0.0) for s in steps_ms) / len(steps_ms), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
