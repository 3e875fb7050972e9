"""The processes and threads the planner's measurements and training run in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distrec.allocator import keep_freed_memory
from distrec.parallel.comm import backend_for, free_port
from distrec.planner.workload import THREADS_PER_DEVICE


def rank_device(device_type: str, rank: int) -> torch.device:
    """The device of ``rank``: accelerator number ``rank``, or the CPU for every rank."""
    return torch.device("cpu") if device_type == "cpu" else torch.device(device_type, rank)


def spawn_group(fn: Callable, world_size: int, device_type: str, args: tuple = (), threads: int = THREADS_PER_DEVICE) -> None:
    """Call ``fn(rank, world_size, device, *args)`` in ``world_size`` spawned processes.

    The processes join a process group on a free loopback port (NCCL for CUDA, gloo
    otherwise) and use ``threads`` intra-op threads each. ``fn`` must be importable (a
    module-level function); results travel back through a queue passed in ``args``. The
    processes keep freed memory for reuse (``distrec.allocator``), so that what they time
    is the work, not the allocator.
    """
    mp.spawn(_run, args=(fn, world_size, device_type, free_port(), threads, args), nprocs=world_size, join=True)


def _run(rank: int, fn: Callable, world_size: int, device_type: str, port: int, threads: int, args: tuple) -> None:
    keep_freed_memory()
    device = rank_device(device_type, rank)
    if device.type != "cpu":
        torch.accelerator.set_device_index(rank)
    torch.set_num_threads(threads)
    dist.init_process_group(backend_for(device), init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, device, *args)
        dist.barrier()  # no rank tears its connections down while a peer still uses them
    finally:
        dist.destroy_process_group()


@contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads, then restore the previous number."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
