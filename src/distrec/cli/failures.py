"""How a command's failure reaches the user: one line on stderr, never a traceback per rank.

A worker of ``distrec train --nproc-per-node`` does not print its error: it writes it to a
file in the directory named by ``WORKER_ERRORS_ENV``, and the launcher prints the first
one (the root cause; the other ranks fail after it, losing their peer), or names the worker
that a signal killed before it could write (``killed_rank``). A failure the
launcher restarts the workers after (``--max-restarts``) is one line too, in place of torch's
log of it. SIGTERM and SIGINT end a command as ``Interrupted`` (checkpoints are atomic, so
the last one stays intact).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from distrec.io import atomic_write_text

WORKER_ERRORS_ENV = "DISTREC_WORKER_ERRORS"
LAUNCHER_LOGGER = "torch.distributed.elastic.multiprocessing.api"  # logs each failed attempt of the workers
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


def first_worker_failure(directory: Path, attempt: int | None = None) -> str | None:
    """The earliest failure the workers of ``attempt`` (default the last one) reported into ``directory``."""
    files = sorted(Path(directory).glob("attempt*-rank*"))
    if not files:
        return None
    prefix = files[-1].name.split("-")[0] if attempt is None else f"attempt{attempt:04d}"
    reports = [f.read_text().split("\n", 1) for f in files if f.name.startswith(prefix + "-")]
    return min(reports, key=lambda r: int(r[0]))[1] if reports else None


def worker_failure(rank: int, exitcode: int, directory: Path, attempt: int) -> str:
    """What ended worker ``rank`` in ``attempt``, in a few words: the signal that killed it, or
    the error it reported (its last line for a traceback), or its exit code."""
    if exitcode < 0:
        return f"rank {rank} died ({signal.Signals(-exitcode).name})"
    reported = first_worker_failure(directory, attempt)
    if reported is None:
        return f"rank {rank} exited with code {exitcode}"
    return f"rank {rank} failed: {reported.strip().splitlines()[-1].removeprefix('distrec: error: ')}"


def killed_rank(failures: dict[int, tuple[int, float]]) -> tuple[int, int] | None:
    """The worker a signal killed, from the workers' failures (rank -> exit code, and when the
    launcher saw it): its rank and exit code, when it was among the first the launcher saw
    fail; None when those reported an error, or died of the SIGTERM the launcher sends the
    others after a failure (which fail losing their peer: their errors are consequences)."""
    first_seen = min(seen for _, seen in failures.values())
    killed = sorted(r for r, (code, seen) in failures.items() if seen == first_seen and code < 0 and -code != signal.SIGTERM)
    return (killed[0], failures[killed[0]][0]) if killed else None


class _RestartAnnouncer(logging.Filter):
    """Drops torch's log line of each failed attempt; prints one line of ours for the attempts
    the launcher restarts after (the last failure is reported when the launcher gives up)."""

    def __init__(self, max_restarts: int, directory: Path, resume_point: Callable[[], str]) -> None:
        super().__init__()
        self.max_restarts, self.directory, self.resume_point = max_restarts, directory, resume_point
        self.failures = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("failed (exitcode: ") or len(record.args or ()) < 2:
            return True
        exitcode, rank = int(record.args[0]), int(record.args[1])  # type: ignore[index]
        self.failures += 1
        if self.failures <= self.max_restarts:
            what = worker_failure(rank, exitcode, self.directory, self.failures - 1)
            print(f"distrec: {what}; restarting {self.resume_point()} (restart {self.failures} of {self.max_restarts})", file=sys.stderr, flush=True)
        return False


@contextmanager
def announcing_restarts(max_restarts: int, directory: Path, resume_point: Callable[[], str]) -> Iterator[None]:
    """Inside the block each failed attempt of the elastic launcher's workers that is restarted
    is one line on stderr, e.g. ``distrec: rank 1 died (SIGKILL); restarting from step 200
    (restart 1 of 3)``; ``resume_point`` says where the next attempt starts. The workers'
    own reports are read from ``directory`` (see ``report``)."""
    logger = logging.getLogger(LAUNCHER_LOGGER)
    announcer = _RestartAnnouncer(max_restarts, directory, resume_point)
    logger.addFilter(announcer)
    try:
        yield
    finally:
        logger.removeFilter(announcer)


FILE_SIZE_LIMIT = getattr(errno, "EFBIG", 27)


def os_error_line(error: OSError) -> str:
    """One line for a failed read or write of a file: what failed, on which path, and the fix."""
    path = error.filename if error.filename2 is None else f"{error.filename} -> {error.filename2}"
    fixes = {
        errno.ENOSPC: "free space there or choose another location",
        errno.EDQUOT: "free space there or choose another location",
        FILE_SIZE_LIMIT: "raise the file size limit (ulimit -f) or choose another location",
        errno.EROFS: "the file system is read-only; choose a writable location",
        errno.EACCES: "check the permissions of the path, or choose another location",
        errno.EPERM: "check the permissions of the path, or choose another location",
        errno.ENOTDIR: "a part of the path is a file, not a directory; choose another path",
        errno.EEXIST: "a file stands where a directory is needed; choose another path",
        errno.ENOENT: "check the path",
    }
    return f"{error.strerror or type(error).__name__} at {str(path)!r}; {fixes.get(error.errno or 0, 'check the path and its file system')}"
