"""Step times with glibc's default allocator settings against ``distrec.allocator.keep_freed_memory``.

Two workloads, each timed in fresh processes, one with the allocator left alone
(``DISTREC_KEEP_FREED_MEMORY=0``, the baseline) and one with freed memory kept for reuse,
the pair repeated ``--repeats`` times, in turns, so both see the same machine load:

- ``lookup``: the planner's embedding work (``distrec.planner.workload.LookupWorkload``:
  pooled lookups, sparse backward, SGD) of the busiest device of a generated 8-device task
  with dims up to 128, on one thread, timed in thread CPU time as the planner's
  micro-benchmarks are;
- ``train``: distrec's DLRM training step of ``benchmarks/train_throughput.py`` (26 tables x
  100,000 rows x dim 64, batch 2048) with multi-hot bags (pooling factor 20), wall clock.

Printed per workload: the median step (ms), the spread of steps (90th over 10th percentile),
minor page faults per step and peak RSS, for both settings, and ``speedup`` = baseline
median / kept median. The last line is the harness's result record: every step's time per
workload and setting, ``ratio`` the speedup when one workload ran, and every figure.

Usage:
    python benchmarks/allocator.py
    python benchmarks/allocator.py --repeats 5 --steps 40
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

import harness
from distrec.allocator import OPT_OUT_VARIABLE, keep_freed_memory

WORKLOADS = ("lookup", "train")
SETTINGS = {"default": "0", "keep": "1"}  # setting name -> DISTREC_KEEP_FREED_MEMORY


def lookup_step():
    """The busiest device's lookup step of a generated (8 devices, max dim 128) task, and its clock."""
    from distrec.planner.api import plan_tables
    from distrec.planner.emit import device_tables
    from distrec.planner.table_pool import generate_tasks, make_table_pool
    from distrec.planner.workload import LookupWorkload

    torch.set_num_threads(1)
    task = generate_tasks(make_table_pool(0), 1, 8, 128, seed=0)[0]
    plan, _ = plan_tables(task.tables, 8, task.memory_per_device, algorithm="lookup-greedy")
    busiest = max(device_tables(plan, task.tables), key=lambda ts: sum(t.dim * t.pooling_factor for t in ts))
    workload = LookupWorkload(busiest, 4096, torch.device("cpu"), np.random.default_rng(0))
    return workload.step, time.thread_time


def train_step():
    """distrec's training step of the throughput benchmark with pooling factor 20, and its clock."""
    sys.path.insert(0, str(Path(__file__).parent))
    from train_throughput import Setup, distrec_step_fn, make_data

    setup = Setup(pooling_factor=20)
    torch.set_num_threads(setup.threads)
    torch.manual_seed(setup.seed)
    tables, batches = make_data(setup)
    step, _ = distrec_step_fn(setup, tables, "sgd")
    batch_cycle = itertools.cycle(batches)
    return (lambda: step(next(batch_cycle))), time.perf_counter


def measure(workload: str, steps: int, warmup: int) -> dict:
    """Time ``steps`` steps of a workload in this process (after ``warmup``): ms and faults."""
    kept = keep_freed_memory()
    step, clock = {"lookup": lookup_step, "train": train_step}[workload]()
    for _ in range(warmup):
        step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(steps):
        start = clock()
        step()
        times.append((clock() - start) * 1e3)
    return {
        "kept": kept,
        "times_ms": times,
        "faults_per_step": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def run_worker(workload: str, setting: str, args: argparse.Namespace, round_index: int) -> dict:
    """``measure`` in a fresh process with the allocator ``setting`` (one round of the pair)."""
    spec = {"workload": workload, "steps": args.steps, "warmup": args.warmup}
    return harness.run_worker(__file__, spec, env={OPT_OUT_VARIABLE: SETTINGS[setting]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3, help="process pairs per workload")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(harness.WORKER_FLAG, dest="worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(measure(spec["workload"], spec["steps"], spec["warmup"])))
        return
    summary: dict = {"torch": torch.__version__, "steps": args.steps, "repeats": args.repeats}
    systems = []
    for workload in args.workloads:
        settings = {setting: partial(run_worker, workload, setting, args) for setting in SETTINGS}
        runs = harness.interleaved_rounds(settings, args.repeats, after_round=lambda r: print(f"  {workload} repeat {r + 1}/{args.repeats} done", flush=True))
        figures = {}
        for setting, results in runs.items():
            times = harness.Samples([t for res in results for t in res["times_ms"]])
            systems.append(harness.SystemResult(f"{workload}, {setting}", "step time", "ms", times))
            figures[setting] = {
                "median_ms": round(times.median, 2),
                "p90_over_p10": round(times.spread, 3),
                "faults_per_step": round(statistics.fmean(res["faults_per_step"] for res in results), 1),
                "peak_rss_bytes": max(res["peak_rss_bytes"] for res in results),
                "applied": all(res["kept"] for res in results),
            }
            f = figures[setting]
            print(
                f"{workload:7s} {setting:8s} median {f['median_ms']:7.2f} ms, p90/p10 {f['p90_over_p10']:.2f}, "
                f"{f['faults_per_step']:8.1f} faults/step, peak RSS {f['peak_rss_bytes'] / 2**20:.0f} MiB",
                flush=True,
            )
        figures["speedup"] = round(figures["default"]["median_ms"] / figures["keep"]["median_ms"], 3)
        print(f"{workload:7s} speedup (default / keep): {figures['speedup']:.2f}", flush=True)
        summary[workload] = figures
    ratio = summary[args.workloads[0]]["speedup"] if len(args.workloads) == 1 else None
    harness.finish(harness.ResultRecord("allocator", systems, ratio, summary))


if __name__ == "__main__":
    main()
