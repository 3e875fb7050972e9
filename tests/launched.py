"""The workers of a ``distrec train --nproc-per-node`` launcher, found through Linux's /proc."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from distrec.cli.orphans import LAUNCHER_PID_ENV


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (exists and is not a zombie waiting to be reaped)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def workers_of(launcher: int) -> dict[int, int]:
    """The workers that the ``distrec train`` process ``launcher`` started: rank -> pid."""
    workers = {}
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = dict(v.split("=", 1) for v in (proc / "environ").read_bytes().decode().split("\0") if "=" in v)
        except (OSError, ValueError, IndexError):  # not a process, or gone meanwhile
            continue
        if parent == launcher and LAUNCHER_PID_ENV in env:
            workers[int(env["RANK"])] = int(proc.name)
    return workers


def wait_until_gone(pids: Iterable[int]) -> list[int]:
    """Wait for ``pids`` to end; those still running after a long guard."""
    pids = list(pids)
    deadline = time.monotonic() + 120  # a guard against a hang, not a time a test measures
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if running(pid)]
