"""How much a thread reading a memory-mapped file from disk slows computation on the other core.

Hotline's prefetch worker gathers cold rows from the disk tier (page faults) while the
training thread computes the popular micro-batch. On a machine with few cores the kernel's
work for those reads (fault handling, I/O completion, the process's memory-map lock) is not
confined to the worker's core. This benchmark measures that directly: one thread runs a
fixed MLP forward and backward (one compute thread, like the benchmarks of
``benchmarks/hotline.py``) while a second thread, in turns,

- ``idle``: sleeps;
- ``ram``: gathers random 256-byte rows from a table in RAM (CPU work, no I/O);
- ``disk``: gathers random rows from a memory-mapped file whose pages were evicted
  (``madvise(MADV_PAGEOUT)``), so every row is a major page fault: Hotline's cold gather;
- ``disk_placed``: the same, with the threads placed as Hotline places them
  (``distrec.hotline.placement``): computing on the CPUs that do not handle the disk's
  interrupts, gathering on those that do;
- ``disk_on_interrupt_cpus``: the same, with the computing thread on the interrupt CPUs.

The placed modes need a disk whose interrupts are found and a CPU left over; otherwise they
are skipped. It prints the compute thread's median ms per iteration for each, and the ratios
to ``idle`` (1.0: no interference). The last line is the harness's result record (the compute
thread's ms per round in each mode) with every figure.

Usage:
    python benchmarks/page_fault_interference.py            # ~1 minute, a 1 GB scratch file
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import torch

import harness
from distrec.hotline.placement import ThreadPlacement
from distrec.hotline.tiers import map_scratch_file
from hotline import PageCacheLimit  # benchmarks/hotline.py

ROW_FLOATS = 64


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4_000_000, help="rows of the table (64 floats each)")
    p.add_argument("--gather-rows", type=int, default=300, help="rows per gather (Hotline's cold rows per step)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--iterations", type=int, default=5, help="compute iterations per round and mode")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the scratch file goes (unlinked at once)")
    args = p.parse_args()
    torch.set_num_threads(1)
    disk = torch.from_numpy(map_scratch_file(Path(args.dir), args.rows, ROW_FLOATS))
    disk.fill_(1.0)  # every page written once, then evicted before each measurement
    ram = disk.clone()

    source: dict[str, torch.Tensor | None] = {"table": None}
    stop = threading.Event()

    def gatherer() -> None:
        gen = torch.Generator().manual_seed(0)
        while not stop.is_set():
            table = source["table"]
            if table is None:
                time.sleep(0.001)
                continue
            torch.index_select(table, 0, torch.randint(0, args.rows, (args.gather_rows,), generator=gen))

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 512, generator=gen)
    w1 = torch.randn(512, 512, generator=gen, requires_grad=True)
    w2 = torch.randn(512, 256, generator=gen, requires_grad=True)

    def compute_ms() -> float:
        started = time.perf_counter()
        for _ in range(args.iterations):
            (torch.relu(x @ w1) @ w2).sum().backward()
        return 1000 * (time.perf_counter() - started) / args.iterations

    worker = threading.Thread(target=gatherer, name="gatherer")
    every_cpu = os.sched_getaffinity(0)
    modes: dict[str, tuple[torch.Tensor | None, ThreadPlacement | None]] = {"idle": (None, None), "ram": (ram, None), "disk": (disk, None)}
    placement = ThreadPlacement.away_from_disk(args.dir, compute_threads=1)
    if placement is not None:
        modes["disk_placed"] = (disk, placement)
        modes["disk_on_interrupt_cpus"] = (disk, ThreadPlacement(compute=placement.prefetch, prefetch=placement.compute))

    def measure(limit: PageCacheLimit, mode: str, round_index: int) -> float:
        """The compute thread's ms per iteration while the gatherer does ``mode``'s work."""
        table, place = modes[mode]
        os.sched_setaffinity(0, place.compute if place else every_cpu)
        os.sched_setaffinity(worker.native_id, place.prefetch if place else every_cpu)
        source["table"] = table
        ms = compute_ms()
        source["table"] = None
        limit.evict_all()
        return ms

    with PageCacheLimit(disk, budget_bytes=0) as limit:
        worker.start()
        try:
            compute_ms()
            limit.evict_all()
            times = harness.interleaved_rounds({mode: partial(measure, limit, mode) for mode in modes}, args.rounds)
        finally:
            stop.set()
            worker.join()
            os.sched_setaffinity(0, every_cpu)
    medians = {m: harness.Samples(t).median for m, t in times.items()}
    result = {
        "compute_ms": medians,
        "ms_per_round": {m: [round(v, 1) for v in t] for m, t in times.items()},
        "placement": placement.describe() if placement is not None else None,
        **{f"slowdown_{m}": medians[m] / medians["idle"] for m in modes if m != "idle"},
    }
    for mode, ms in medians.items():
        print(f"{mode:>22}: {ms:6.1f} ms per iteration, {ms / medians['idle']:.2f}x idle")
    systems = [harness.SystemResult(mode, "compute thread's iteration", "ms", harness.Samples(t)) for mode, t in times.items()]
    harness.finish(harness.ResultRecord("page_fault_interference", systems, None, result))


if __name__ == "__main__":
    main()
