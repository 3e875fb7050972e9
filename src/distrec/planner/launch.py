"""The processes and threads the planner's measurements and training run in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tqdm import tqdm

from distrec.allocator import keep_freed_memory
from distrec.parallel.comm import backend_for, exit_without_finalizing
from distrec.planner.workload import THREADS_PER_DEVICE


def rank_device(device_type: str, rank: int) -> torch.device:
    """The device of ``rank``: accelerator number ``rank``, or the CPU for every rank."""
    return torch.device("cpu") if device_type == "cpu" else torch.device(device_type, rank)


def spawn_group(fn: Callable, world_size: int, device_type: str, args: tuple = (), threads: int = THREADS_PER_DEVICE) -> None:
    """Call ``fn(rank, world_size, device, *args)`` in ``world_size`` spawned processes.

    The processes join a process group (NCCL for CUDA, gloo otherwise) through a store this
    process serves on a loopback port, and use ``threads`` intra-op threads each. ``fn`` must be importable (a
    module-level function); results travel back through a queue passed in ``args``. The
    processes keep freed memory for reuse (``distrec.allocator``), so that what they time
    is the work, not the allocator.
    """
    # The group's store listens here from before the processes start until they have all
    # exited: a port picked free and bound later by rank 0 can be taken in between (by another
    # group or any outgoing connection: seconds of process start-up under load).
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=dist.default_pg_timeout)
    mp.spawn(_run, args=(fn, world_size, device_type, store.port, threads, args), nprocs=world_size, join=True)


def _run(rank: int, fn: Callable, world_size: int, device_type: str, port: int, threads: int, args: tuple) -> None:
    # tqdm's default lock is a multiprocessing semaphore, registered with the parent's resource
    # tracker; this process ends by os._exit, so it would stay registered and the parent would
    # warn of "leaked semaphore objects" at exit. One thread here writes the bars: a thread lock does.
    tqdm.set_lock(threading.RLock())
    keep_freed_memory()
    device = rank_device(device_type, rank)
    if device.type != "cpu":
        torch.accelerator.set_device_index(rank)
    torch.set_num_threads(threads)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=dist.default_pg_timeout)  # as init_method's store waited
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, device, *args)
        dist.barrier()  # no rank tears its connections down while a peer still uses them
    finally:
        dist.destroy_process_group()
    exit_without_finalizing(0)  # done (results sent, files written)


@contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads, then restore the previous number."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
