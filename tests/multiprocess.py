"""Run a test function in N real processes joined by a gloo process group.

The ranks are forked from a fork server that has imported torch and distrec once, instead
of each importing them again (seconds of CPU per process, most of a short multi-process
test on 2 cores); each rank then takes the caller's current environment, as a spawned
process would.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from distrec.parallel.comm import exit_without_finalizing, free_port

PRELOADED = ["torch", "numpy", "distrec.train.loop", "distrec.modes", "distrec.cli", "multiprocess"]
_forkserver = mp.get_context("forkserver")
_forkserver.set_forkserver_preload(PRELOADED)


def _worker(rank: int, world_size: int, port: int, env: dict[str, str], fn: Callable, args: tuple, results: Any) -> None:
    os.environ.clear()
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        results[rank] = ("ok", fn(rank, world_size, *args))
    except BaseException:
        results[rank] = ("error", traceback.format_exc())
    finally:
        dist.destroy_process_group()
    exit_without_finalizing(0)  # the result is in the manager's dict


def run_distributed(fn: Callable, world_size: int, *args: Any) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` new processes; return their results.

    ``fn`` must be importable (a module-level function). A failure in any rank fails the
    caller with that rank's traceback.
    """
    manager = mp.Manager()
    results = manager.dict()
    mp.start_processes(_worker, args=(world_size, free_port(), dict(os.environ), fn, args, results), nprocs=world_size, join=True, start_method="forkserver")
    out = []
    for rank in range(world_size):
        status, value = results.get(rank, ("error", "rank produced no result"))
        if status != "ok":
            raise AssertionError(f"rank {rank} failed:\n{value}")
        out.append(value)
    return out
