"""Hotline with an embedding table larger than the machine's RAM: no page-cache emulation.

One large table (by default about 1.5x the machine's RAM, as far as the disk allows) and 25
small ones of 100 rows (Criteo's mix, as ``benchmarks/hotline.py``), all in one file of
float32 rows on disk, written chunk by chunk (the table is never in memory). The same DLRM
then trains four ways, each in its own process (so each has its own RSS and disk-read
counters), taking turns at ``--block-steps`` steps in a random order every round:

- ``mmap`` (b0): every row in the file, memory-mapped, each row's page read when the
  gather faults on it (``hotline.readahead: false``): a plain memory-mapped table;
- ``readahead`` (b): the same slow tier whose gathers first start the reads of all the
  pages they touch (``distrec.hotline.readahead``), synchronous, no hot set;
- ``hotline`` (c): ``HotlineTraining`` on the same file (``hotline.slow_tier_file``): the
  hot set (learned from ``--learn-steps`` mini-batches, as ``benchmarks/hotline.py`` does)
  in RAM, the popular micro-batch running while a worker gathers the other's cold rows;
- ``hotline_unplaced``: (c) with its threads left to the scheduler (``hotline.place_threads:
  false``): on a machine others load, a step pinned to one CPU cannot move to the other;
- ``in_memory_scaled`` (a'): ordinary training with every table in RAM, the large one
  scaled down to ``--scaled-gb`` (same Zipf exponent and generator, fewer rows): the speed
  given up by going beyond RAM.

(b0), (b) and (c) share the one file (there is not disk for three) and so the page cache:
a page one of them read stays cached for the others. Trained on identical mini-batches,
whichever ran a block second would find every page the first had read; so each trains on
its own slice of the same synthetic stream (same generator, same hot rows, different
samples): pages of rows popular in the distribution are cached for all, as in one long
run, and each system's tail rows are its own first reads. The file's pages written while
building are written back and dropped from the page cache (``posix_fadvise``), so training
starts cold. Nothing limits the page cache: it holds whatever RAM the machine has free.

Reported per system: samples/s (median step), bytes read from storage per step
(``/proc/self/io`` ``read_bytes``, the prefetch worker's included), and memory: ``VmHWM``
(the kernel's peak resident set, which counts the pages of the mapped file the process
touched while they are resident), and the peaks of ``RssAnon`` (the process's own memory:
fast tier, slot map, model, batches) and ``RssFile`` sampled after every step. Hotline's
popular fraction and hot-set size come from its stats. The last line is the harness's result
record (every system's step times, its other figures beside them; ``ratio`` = c/b0) with
``ratio_vs_mmap`` (c/b0), ``ratio_vs_readahead`` (c/b), ``ratio_vs_in_memory_scaled``
(c/a'), ``peak_rss_fraction_of_ram`` ((c)'s VmHWM over RAM), ``peak_anon_fraction_of_ram``,
``table_gb``, ``build_seconds`` and ``run_seconds``; ``--out`` also gets
``hotline-beyond-ram.json``. The table's file is removed at the end, on an error and on
Ctrl-C or SIGTERM.

Usage:
    python benchmarks/hotline_beyond_ram.py                  # 1.5x RAM: 37.9 GB here, 3-18 minutes
    python benchmarks/hotline_beyond_ram.py --table-gb 2     # quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import harness
from distrec.components.optim import make_optimizers
from distrec.components.step import TrainStep
from distrec.data.batch import Batch
from distrec.hotline.embedding import HotlineEmbeddingBagCollection, stacked_rows_init
from distrec.hotline.optim import TieredRowOptimizer
from distrec.hotline.row_state import row_state_floats
from distrec.hotline.tiers import CHUNK_BYTES, FLOAT_BYTES
from distrec.hotline.training import HotlineTraining
from distrec.models.build import build_model
from distrec.tables import TableConfig, stand_in_tables
from hotline import LR, Setup, System, in_memory, make_batches, model_config, run_config

GB = 10**9
TABLE_FILE = "hotline-beyond-ram-table.f32"
SYSTEMS = ("mmap", "readahead", "hotline", "hotline_unplaced")  # on the file; then in_memory_scaled
MEMORY_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile")


@dataclass
class BeyondRamSetup(Setup):
    """``benchmarks/hotline.py``'s configuration, with the large table sized in GB (its
    ``big_rows`` follow from ``table_gb``; ``page_cache`` is unused: nothing is emulated)."""

    table_gb: float = 0.0  # the large table's size; 0: about 1.5x RAM, as far as the disk allows
    scaled_gb: float = 8.0  # (a')'s large table, in RAM
    keep_free_gb: float = 20.0  # the disk space the table must leave free
    timed_steps: int = 60


def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choose_table_bytes(table_gb: float, directory: Path, keep_free_gb: float) -> tuple[int, str]:
    """The large table's bytes (``table_gb``, or 1.5x RAM when 0), never leaving less than
    ``keep_free_gb`` free on ``directory``'s disk; and a sentence saying why."""
    ram, free = ram_bytes(), shutil.disk_usage(directory).free
    room = free - int(keep_free_gb * GB)
    disk = f"{free / GB:.1f} GB free on {directory}'s disk, {keep_free_gb:g} GB kept free"
    if table_gb > 0:
        if table_gb * GB > room:
            raise SystemExit(f"--table-gb {table_gb:g} does not fit ({disk}); ask for at most {max(room, 0) / GB:.1f}")
        chosen, why = int(table_gb * GB), "as asked"
    elif room < ram // 10:
        raise SystemExit(f"no room for a table ({disk}); free disk space or lower --keep-free-gb")
    else:
        chosen = min(int(1.5 * ram), room)
        why = "1.5x RAM" if chosen == int(1.5 * ram) else "the disk's room"
    beyond = "larger than RAM" if chosen > ram else "NOT larger than RAM"
    return chosen, f"large table {chosen / GB:.1f} GB ({why}; RAM {ram / GB:.1f} GB, {disk}): {beyond}"


def build_table(path: Path, rows: Callable[[int, int], torch.Tensor], num_rows: int, width: int, dim: int) -> None:
    """Write float32 [num_rows, width] rows to a new file ``path``, chunk by chunk: weights
    ``rows(start, end)`` in the first ``dim`` columns, zero optimizer state after them.
    Written chunks are synced and dropped from the page cache, so the table is never in
    memory and training starts cold."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, num_rows * width * FLOAT_BYTES)  # fails now, not halfway, without room
        chunk = max(1, CHUNK_BYTES // (width * FLOAT_BYTES))
        with open(fd, "wb", closefd=False) as f, tqdm(total=num_rows * width * FLOAT_BYTES, unit="B", unit_scale=True, desc="building the table") as bar:
            block = torch.zeros(min(chunk, num_rows), width)  # one buffer: a new one per chunk would be faulted in anew
            for start in range(0, num_rows, chunk):
                end = min(start + chunk, num_rows)
                block[: end - start, :dim] = rows(start, end)
                f.write(block[: end - start].numpy().data)
                f.flush()
                os.fdatasync(fd)
                os.posix_fadvise(fd, start * width * FLOAT_BYTES, (end - start) * width * FLOAT_BYTES, os.POSIX_FADV_DONTNEED)
                bar.update((end - start) * width * FLOAT_BYTES)
    finally:
        os.close(fd)


class MemoryPeaks:
    """Peaks of this process's memory figures (``/proc/self/status``, bytes), sampled on demand."""

    def __init__(self) -> None:
        self.peaks = dict.fromkeys(MEMORY_FIELDS, 0)

    def sample(self) -> None:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in self.peaks:
                    self.peaks[key] = max(self.peaks[key], int(value.split()[0]) * 1024)


@dataclass
class WorkerSpec:
    """What one system's process needs: its kind, the tables, its mini-batches and the file."""

    kind: str
    setup: BeyondRamSetup
    tables: list[TableConfig]
    batches: list[Batch]
    learn: list[Batch]
    table_file: Path


def on_file(spec: WorkerSpec, readahead: bool) -> System:
    """(b0) or (b): every row in the table's file, gathered and updated synchronously."""
    s = spec.setup
    torch.manual_seed(s.seed)
    model = build_model(model_config(s), s.num_dense, stand_in_tables(spec.tables))
    model.embeddings = embeddings = HotlineEmbeddingBagCollection(spec.tables, slow="disk", readahead=readahead, slow_file=spec.table_file)
    step = TrainStep(model, [*make_optimizers(model, "sgd", LR), TieredRowOptimizer(embeddings, lr=LR)])
    return System(spec.kind, step)


def hotline_on_file(spec: WorkerSpec) -> System:
    """(c): Hotline on the table's file, its hot set learned from ``spec.learn`` first."""
    s = spec.setup
    torch.manual_seed(s.seed)
    model = build_model(model_config(s), s.num_dense, stand_in_tables(spec.tables))
    cfg = run_config(dataclasses.replace(s, place_threads=s.place_threads and spec.kind == "hotline"), spec.table_file.parent, relearn_every=0)
    cfg.hotline.slow_tier_file = str(spec.table_file)
    training = HotlineTraining(model, cfg, len(spec.batches), spec.table_file.parent, tables=spec.tables)
    training.learn(spec.learn)
    return System(spec.kind, training.step, hotline=training)


def make_system(spec: WorkerSpec) -> System:
    if spec.kind == "in_memory_scaled":
        return in_memory(spec.setup, spec.tables)
    return hotline_on_file(spec) if spec.kind.startswith("hotline") else on_file(spec, readahead=spec.kind == "readahead")


def serve(spec: WorkerSpec, conn: Connection) -> None:
    """A system's process: build it, then run the blocks of steps the parent sends (a list
    of batch indices each; None ends), answering each; at the end its figures."""
    torch.set_num_threads(spec.setup.threads)
    memory = MemoryPeaks()
    started = time.perf_counter()
    system = make_system(spec)
    memory.sample()
    conn.send(time.perf_counter() - started)
    while (block := conn.recv()) is not None:
        for i in block:
            system.run(spec.batches[i], record=i >= spec.setup.warmup_steps)
            system.reclaim(record=i >= spec.setup.warmup_steps)  # no page-cache limit: times nothing
            memory.sample()
        conn.send(None)
    figures = {k: v for k, v in system.figures(spec.setup.batch_size).items() if "reclaim" not in k and "evicted" not in k}
    figures.update({f"peak_{k}_bytes": v for k, v in memory.peaks.items()})
    if system.hotline is not None:
        stats = system.hotline.pipeline.stats
        figures.update(
            popular_fraction=stats.popular_fraction,
            hot_lookup_fraction=stats.hot_lookup_fraction,
            prefetch_wait_ms_per_step=1000 * stats.prefetch_wait_seconds / max(stats.steps, 1),
            **{k: v for k, v in system.hotline.stats().items() if k.endswith(("bytes", "cpus")) or k == "hot_rows"},
        )
        system.hotline.close()
    conn.send(figures)


class Worker:
    """A system in its own process (spawned: no state shared with the parent or another)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.name = spec.kind
        self.conn, child = multiprocessing.get_context("spawn").Pipe()
        self.process = multiprocessing.get_context("spawn").Process(target=serve, args=(spec, child), name=spec.kind)
        self.process.start()
        child.close()

    def receive(self) -> Any:
        try:
            return self.conn.recv()
        except EOFError:
            self.process.join(timeout=5)
            raise SystemExit(f"the {self.name} system's process failed (exit code {self.process.exitcode}); see its error above") from None

    def run(self, block: list[int]) -> None:
        self.conn.send(block)
        self.receive()

    def finish(self) -> dict:
        self.conn.send(None)
        return self.receive()

    def stop(self) -> None:
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()


def measure(setup: BeyondRamSetup, specs: list[WorkerSpec]) -> dict:
    """Samples/s, disk reads and memory of every system, stepping them in turns."""
    workers = []
    try:
        for spec in specs:
            workers.append(Worker(spec))
        build = {w.name: w.receive() for w in workers}
        steps = len(specs[0].batches)

        def block(worker: Worker) -> Callable[[int], None]:
            return lambda r: worker.run(list(range(r * setup.block_steps, min((r + 1) * setup.block_steps, steps))))

        rounds = -(-steps // setup.block_steps)
        harness.interleaved_rounds({w.name: block(w) for w in workers}, rounds, shuffle_seed=setup.seed)
        result = {w.name: w.finish() for w in workers}
        for name, seconds in build.items():
            result[name]["setup_seconds"] = seconds
        return result
    finally:
        for w in workers:
            w.stop()


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP end the run as Ctrl-C does, through the ``finally`` that removes the file."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_options(p, {k: v for k, v in asdict(BeyondRamSetup()).items() if k not in ("big_rows", "big_tables", "page_cache")})
    p.add_argument("--out", type=Path, default=Path("runs/bench-hotline-beyond-ram"), help="folder for the JSON and the table's file (removed at the end)")
    args = p.parse_args()
    setup = BeyondRamSetup(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BeyondRamSetup) if hasattr(args, f.name)})
    args.out.mkdir(parents=True, exist_ok=True)
    width = setup.dim + row_state_floats("sgd", setup.dim)
    table_bytes, why = choose_table_bytes(setup.table_gb, args.out, setup.keep_free_gb)
    print(why, flush=True)
    setup = dataclasses.replace(setup, big_rows=table_bytes // (width * FLOAT_BYTES))
    scaled = dataclasses.replace(setup, big_rows=int(setup.scaled_gb * GB) // (setup.dim * FLOAT_BYTES))
    table_file = (args.out / TABLE_FILE).resolve()
    stop_on_signals()
    load = os.getloadavg()
    started = time.perf_counter()
    try:
        n = setup.warmup_steps + setup.timed_steps
        tables, batches = make_batches(setup, setup.learn_steps + len(SYSTEMS) * n)
        learn, own = batches[: setup.learn_steps], batches[setup.learn_steps :]
        scaled_tables, scaled_batches = make_batches(scaled, n)
        data_seconds = time.perf_counter() - started
        num_rows = sum(t.num_rows for t in tables)
        torch.manual_seed(setup.seed)  # the weights every system's model starts from
        init = stacked_rows_init(build_model(model_config(setup), setup.num_dense, stand_in_tables(tables)).embeddings.initializer.for_tables(tables))
        built = time.perf_counter()
        build_table(table_file, init, num_rows, width, setup.dim)
        build_seconds = time.perf_counter() - built
        specs = [
            WorkerSpec(kind, setup, tables, own[k * n : (k + 1) * n], learn if kind.startswith("hotline") else [], table_file) for k, kind in enumerate(SYSTEMS)
        ]
        specs.append(WorkerSpec("in_memory_scaled", scaled, scaled_tables, scaled_batches, [], table_file))
        ran = time.perf_counter()
        systems = measure(setup, specs)
        run_seconds = time.perf_counter() - ran
    finally:
        table_file.unlink(missing_ok=True)
    for name, figures in systems.items():
        print(f"{name:>16}: {figures['samples_per_s']:9,.0f} samples/s  {json.dumps(figures)}", flush=True)
    c, ram = systems["hotline"], ram_bytes()
    result = {
        "setup": asdict(setup),
        "note": why,
        "load_average_before": load,
        "load_average_after": os.getloadavg(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "ram_bytes": ram,
        "table_rows": num_rows,
        "popular_fraction": c["popular_fraction"],
        "hot_rows": c["hot_rows"],
        "data_seconds": data_seconds,
        "ratio_vs_mmap": c["samples_per_s"] / systems["mmap"]["samples_per_s"],
        "ratio_vs_readahead": c["samples_per_s"] / systems["readahead"]["samples_per_s"],
        "ratio_vs_in_memory_scaled": c["samples_per_s"] / systems["in_memory_scaled"]["samples_per_s"],
        "unplaced_ratio_vs_mmap": systems["hotline_unplaced"]["samples_per_s"] / systems["mmap"]["samples_per_s"],
        "unplaced_ratio_vs_readahead": systems["hotline_unplaced"]["samples_per_s"] / systems["readahead"]["samples_per_s"],
        "peak_rss_fraction_of_ram": c["peak_VmHWM_bytes"] / ram,
        "peak_anon_fraction_of_ram": c["peak_RssAnon_bytes"] / ram,
        "table_gb": num_rows * width * FLOAT_BYTES / GB,
        "build_seconds": build_seconds,
        "run_seconds": run_seconds,
        "total_seconds": time.perf_counter() - started,
    }
    measured = [
        harness.SystemResult(name, "step time", "ms", harness.Samples(figures["ms_per_step"]), {k: v for k, v in figures.items() if k != "ms_per_step"})
        for name, figures in systems.items()
    ]
    harness.finish(harness.ResultRecord("hotline_beyond_ram", measured, result["ratio_vs_mmap"], result), args.out / "hotline-beyond-ram.json")


if __name__ == "__main__":
    main()
