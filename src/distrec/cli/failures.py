"""How a command's failure reaches the user: one line on stderr, never a traceback per rank.

A worker of ``distrec train --nproc-per-node`` does not print its error: it writes it to a
file in the directory named by ``WORKER_ERRORS_ENV``, and the launcher prints the first
one (the root cause; the other ranks fail after it, losing their peer). SIGTERM and SIGINT
end a command as ``Interrupted`` (checkpoints are atomic, so the last one stays intact).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from distrec.io import atomic_write_text

WORKER_ERRORS_ENV = "DISTREC_WORKER_ERRORS"
INTERRUPTED_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as shells report it


class Interrupted(KeyboardInterrupt):
    """The command was stopped by ``signum`` (Ctrl-C or SIGTERM); ``detail`` says what was kept."""

    def __init__(self, signum: int = signal.SIGINT, detail: str = "") -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signal.Signals(signum)
        self.detail = detail


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises ``Interrupted`` like Ctrl-C does (in the main thread;
    elsewhere signals cannot be handled and the block runs unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def in_worker() -> bool:
    """Whether this process is a worker that ``distrec train --nproc-per-node`` launched."""
    return WORKER_ERRORS_ENV in os.environ


def report(line: str) -> None:
    """Show ``line`` (one line, or a traceback for a bug) to the user: on stderr, or from a
    worker through its error file, stamped with the time so the launcher can tell the first."""
    if not in_worker():
        print(line, file=sys.stderr)
        return
    attempt, rank = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), os.environ.get("RANK", "0")
    atomic_write_text(Path(os.environ[WORKER_ERRORS_ENV]) / f"attempt{int(attempt):04d}-rank{rank}", f"{time.time_ns()}\n{line}")


def report_interrupted(e: KeyboardInterrupt) -> int:
    """Say how the command was stopped (workers stay silent: the launcher says it); its status."""
    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    if not in_worker():
        how = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"stopped by {signum.name}"
        detail = e.detail if isinstance(e, Interrupted) else ""
        print(f"distrec: {how}" + (f"; {detail}" if detail else ""), file=sys.stderr)
    return INTERRUPTED_STATUS.get(signum, 128 + int(signum))


def first_worker_failure(directory: Path) -> str | None:
    """The earliest failure the workers of the last attempt reported into ``directory``."""
    files = sorted(Path(directory).glob("attempt*-rank*"))
    if not files:
        return None
    last = files[-1].name.split("-")[0]
    reports = [f.read_text().split("\n", 1) for f in files if f.name.startswith(last + "-")]
    return min(reports, key=lambda r: int(r[0]))[1]
