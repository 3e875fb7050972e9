"""Workers do not outlive the launcher of ``distrec train --nproc-per-node``.

A launcher that is killed outright (``kill -9``, the out-of-memory killer) cannot stop its
workers, which would go on training into the run directory with nobody to report for them.
Each worker therefore gets SIGTERM when its launcher ends: from the kernel on Linux
(``PR_SET_PDEATHSIG``), elsewhere from a thread that checks every ``WATCH_SECONDS`` that its
parent is still the launcher. Every worker gets the signal, so they stop as after a SIGTERM
to the launcher: each finishes its step, all save a checkpoint at the same step, and exit.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

LAUNCHER_PID_ENV = "DISTREC_LAUNCHER_PID"
"""The launcher's pid, which it sets in its workers' environment."""
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
WATCH_SECONDS = 1.0
"""Seconds between two checks of the parent where the kernel cannot signal its death."""


def stop_with_launcher() -> None:
    """In a worker (``LAUNCHER_PID_ENV`` set): have SIGTERM sent to this process when the
    launcher ends, and send it now if the launcher already ended. Elsewhere nothing."""
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if launcher is None:
        return
    if not _signal_on_parent_death():
        threading.Thread(target=_watch_parent, args=(int(launcher),), name="distrec-launcher-watch", daemon=True).start()
    if os.getppid() != int(launcher):  # it ended before the kernel was asked: this worker was adopted
        os.kill(os.getpid(), signal.SIGTERM)


def _signal_on_parent_death() -> bool:
    """Ask the kernel for SIGTERM when the parent ends (Linux); whether it agreed.

    The kernel signals when the parent's thread that started this process ends: torch's
    elastic launcher starts its workers from its main thread, which lives as long as it does.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no C library or no prctl in it
        return False


def _watch_parent(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(WATCH_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)
