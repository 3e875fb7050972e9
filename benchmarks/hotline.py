"""Hotline's speed with tables larger than the page cache may keep, and its tracking of drift.

Speed: the same DLRM trains on the same Zipf-distributed synthetic mini-batches three ways,
with the embedding tables many times larger than the page cache allowed to stay resident:

- ``in_memory`` (a): ordinary training, every table in RAM (the ceiling);
- ``slow_tier`` (b): every row in the slow tier (a memory-mapped file on disk), gathered and
  updated synchronously, no hot set, no pipelining (the hybrid baseline); its gathers read
  their pages ahead all at once (``distrec.hotline.readahead``), as Hotline's do;
- ``slow_tier_fault_by_fault`` (b0): the same without the readahead (``readahead=False``,
  ``hotline.readahead: false`` in a run's config), so each row's page is
  read when the gather faults on it, as with a plain memory-mapped table;
- ``hotline`` (c): ``distrec.hotline.training.HotlineTraining``: the hot set in the fast
  tier, the popular micro-batch running while a worker gathers the non-popular one's cold
  rows. Its learning phase is shortened (``HotlineTraining.learn``): the access logger
  counts the ids of ``--learn-steps`` mini-batches, the ones a sample rate of
  ``--sample-rate`` would pick in a longer phase, without training on them (training at
  that time runs at slow-tier speed, which (b) measures), then the hot set is selected once.

The data imitates Criteo's mix of table sizes: one large table holds nearly all rows and
25 small ones of 100 rows the rest (Criteo Kaggle has 3 tables above a million rows and
several below a hundred); every feature is Zipf(1.05). Popular inputs are those whose
large-table row is hot: about 72% here with a 16 MB fast tier, near the paper's ~75%
(Adnan et al., ISCA 2024, Fig. 6). Zipf(1.05) has a heavy tail, so more needs a hot set
learned from far more samples than a benchmark run can afford. The dense layers are small
(bottom 256-64, top 256), the paper's regime, where dense compute on the accelerator is fast
next to the slow tier; with larger MLPs on one CPU core the compute itself hides more of the
slow tier and every ratio moves towards 1.

How the page cache is limited. The machine has 24 GiB of RAM, so a file of a few GB would
simply stay cached; dropping the whole page cache (/proc/sys/vm/drop_caches) needs
privileges this sandbox lacks, and the memory cgroups here belong to the sandbox's own
machinery, so the benchmark leaves them alone. Instead ``PageCacheLimit`` keeps the
slow tier's resident pages under a byte budget itself: after every step it lists them
(``mincore``) and evicts random ones beyond the budget (``sync_file_range`` then
``madvise(MADV_PAGEOUT)``, so a dirty page is written back first, as reclaim would). Random
replacement approximates the kernel's LRU-like reclaim. (b) and (b0) may keep
``--page-cache`` bytes of the slow tier resident, (c) the same memory minus its fast tier.
Major page faults would not show that the disk is read (a page read ahead is a minor fault
when touched), so each system's bytes read from the disk per step are taken from
``/proc/self/io``. The eviction is timed apart from the step: the headline
figures assume it overlaps training, as the kernel's background reclaim and writeback do;
the ``*_with_reclaim`` figures add it to every step (a worst case; the emulation's own
``mincore`` scan of the whole file is part of it).

Measurement. The machine is shared (other jobs come and go), so the three systems are
built side by side and take turns, ``--block-steps`` consecutive steps each, in a random
order every round (so every system sees the same load periods, and none runs while another
one's disk writes are in flight); each system's median step time gives its samples/s. Every system computes with one thread
(``--threads``): with two, torch's OpenMP regions ran 5-25x slower whenever other
processes held the cores; Hotline's prefetch worker is its own thread. Hotline places its
step on the CPUs that do not handle the disk's interrupts and its worker on those that do
(``distrec.hotline.placement``; ``--no-place-threads`` leaves them to the scheduler). (a)
and (b) are left to the scheduler: pinning (b)'s step the same way made it slower (80-89
against 74-75 ms per step), since each of its synchronous page faults then wakes it across
CPUs.

Drift: a smaller model on data whose popular rows move every ``drift_period`` mini-batches
(``SyntheticConfig.drift_period_rows``), with the slow tier in host memory; the popular
fraction is printed per relearn window: settled, right after the shift, and one relearn
period later (restored when it is back within 10% of the settled value).

The last line printed is the harness's result record (every system's step times, its
figures beside them; ``ratio`` = c/b) with every figure (``ratio_vs_slow_tier`` = c/b,
``ratio_vs_in_memory`` = c/a, ``ceiling_ratio_vs_slow_tier`` = a/b: what c/b would be if
Hotline trained as fast as all tables in RAM); ``--out`` also gets ``hotline-speed.json``,
``hotline-speed.png`` (samples/s and KiB read from disk per step, per system) and, with the
drift run, ``hotline-drift.png`` (the popular fraction of every mini-batch, re-learning
points and shifts marked). The slow tiers' files (2 GB each by default) are unlinked at once
and gone when the run ends.

Usage:
    python benchmarks/hotline.py                       # default: 2 GB tables, a few minutes
    python benchmarks/hotline.py --big-rows 2000000 --page-cache 32MB --hot-budget 16MB \
        --learn-steps 100 --timed-steps 10 --no-drift  # quick
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import mmap
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

import harness
from distrec import config
from distrec.components.optim import make_optimizers
from distrec.components.step import TrainStep
from distrec.config import DataConfig, ModelConfig, SyntheticConfig
from distrec.data.batch import Batch
from distrec.data.dataset import Dataset
from distrec.data.source import Chunk
from distrec.data.synthetic import SyntheticGenerator
from distrec.hotline.embedding import HotlineEmbeddingBagCollection, stacked_rows_init
from distrec.hotline.measure import popular_fraction_figure, systems_figure
from distrec.hotline.optim import TieredRowOptimizer
from distrec.hotline.training import HotlineTraining
from distrec.models.build import build_model
from distrec.tables import TableConfig, stand_in_tables
from distrec.units import parse_bytes

PAGE = mmap.PAGESIZE
MADV_PAGEOUT = 21  # <sys/mman.h>, Linux >= 5.4: reclaim these pages now
SYNC_FILE_RANGE_ALL = 1 | 2 | 4  # <fcntl.h>: wait for earlier writes, write, wait for the writes
LR = 0.01


@dataclass
class Setup:
    """The benchmark configuration (units: samples, rows, floats, bytes)."""

    batch_size: int = 1024
    big_tables: int = 1
    big_rows: int = 8_000_000
    small_tables: int = 25
    small_rows: int = 100
    dim: int = 64
    num_dense: int = 13
    bottom_mlp: list[int] = field(default_factory=lambda: [256, 64])
    top_mlp: list[int] = field(default_factory=lambda: [256])
    zipf_exponent: float = 1.05
    page_cache: str = "32MB"  # slow-tier bytes allowed to stay resident; (c) gets it minus its fast tier
    hot_budget: str = "16MB"
    sample_rate: float = 0.05
    learn_steps: int = 200  # sampled mini-batches of the learning phase (4000 steps at 5%)
    warmup_steps: int = 3
    timed_steps: int = 30
    block_steps: int = 5  # the systems take turns at this many consecutive steps
    threads: int = 1  # compute threads of every system (Hotline's prefetch worker is one more)
    place_threads: bool = True  # Hotline's thread placement (hotline/placement.py), used by every system
    seed: int = 1234

    @property
    def table_bytes(self) -> int:
        return (self.big_tables * self.big_rows + self.small_tables * self.small_rows) * self.dim * 4


class PageCacheLimit:
    """Keeps at most ``budget_bytes`` of a memory-mapped tensor resident in the page cache.

    ``reclaim()`` lists the resident pages (``mincore``) and evicts random ones beyond the
    budget: dirty ones are written back first (``sync_file_range`` on the mapped file,
    opened through /proc/self/map_files since the slow tier's file is already unlinked),
    then dropped (``madvise(MADV_PAGEOUT)``).
    """

    def __init__(self, tensor: torch.Tensor, budget_bytes: int, seed: int = 0) -> None:
        self._libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self._libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self._libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        self.addr = tensor.data_ptr()
        if self.addr % PAGE:
            raise ValueError("the tensor must start a memory mapping")
        self.pages = -(-tensor.numel() * tensor.element_size() // PAGE)
        self._fd = os.open(f"/proc/self/map_files/{self.addr:x}-{self.addr + self.pages * PAGE:x}", os.O_RDWR)
        self.budget_pages = max(0, budget_bytes) // PAGE
        self._vec = np.zeros(self.pages, np.uint8)
        self._rng = np.random.default_rng(seed)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise OSError(ctypes.get_errno(), f"{what} failed")

    def _evict(self, start: int, pages: int) -> None:
        self._check(self._libc.sync_file_range(self._fd, start * PAGE, pages * PAGE, SYNC_FILE_RANGE_ALL), "sync_file_range")
        self._check(self._libc.madvise(self.addr + start * PAGE, pages * PAGE, MADV_PAGEOUT), "madvise")

    def evict_all(self) -> None:
        """Write back and drop every page (start cold)."""
        self._evict(0, self.pages)

    def reclaim(self) -> int:
        """Evict random resident pages beyond the budget; returns how many."""
        self._check(self._libc.mincore(self.addr, self.pages * PAGE, self._vec.ctypes.data), "mincore")
        resident = np.flatnonzero(self._vec & 1)
        excess = resident.size - self.budget_pages
        if excess <= 0:
            return 0
        victims = np.sort(self._rng.choice(resident, excess, replace=False))
        for run in np.split(victims, np.flatnonzero(np.diff(victims) != 1) + 1):
            self._evict(int(run[0]), int(run.size))
        return int(excess)

    def __enter__(self) -> PageCacheLimit:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # else the unlinked file's blocks would outlive the slow tier


def disk_read_bytes() -> int:
    """Bytes this process has had read from storage so far (``/proc/self/io``)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def make_batches(setup: Setup, steps: int) -> tuple[list[TableConfig], list[Batch]]:
    """Tables and ``steps`` mini-batches: ``big_tables`` large and ``small_tables`` small
    Zipf-distributed single-hot features plus the generator's dense features and labels."""
    rows = steps * setup.batch_size
    big_cfg = SyntheticConfig(rows, setup.num_dense, setup.big_tables, setup.big_rows, setup.zipf_exponent, seed=setup.seed)
    small_cfg = SyntheticConfig(rows, 0, setup.small_tables, setup.small_rows, setup.zipf_exponent, seed=setup.seed + 1)
    big, small = SyntheticGenerator(big_cfg), SyntheticGenerator(small_cfg)
    big_chunk, small_chunk = big.generate(0, rows), small.generate(0, rows)
    features = big.features + [dataclasses.replace(f, name=f"S{i + 1}") for i, f in enumerate(small.features)]
    chunk = Chunk(big_chunk.dense, big_chunk.labels, big_chunk.sparse + small_chunk.sparse)
    dataset = Dataset.from_chunk(chunk, features, big.dense_names, DataConfig(max_ind_range=setup.big_rows))
    b = setup.batch_size
    return dataset.tables(setup.dim), [dataset.batch(np.arange(i * b, (i + 1) * b)) for i in range(steps)]


def model_config(setup: Setup) -> ModelConfig:
    return ModelConfig(embedding_dim=setup.dim, bottom_mlp=list(setup.bottom_mlp), top_mlp=list(setup.top_mlp), interaction="dot")


def run_config(setup: Setup, out: Path, relearn_every: int) -> config.RunConfig:
    return config.load(
        None,
        [
            "train.optimizer=sgd",
            f"train.lr={LR}",
            f"train.seed={setup.seed}",
            f"hotline.hot_budget={setup.hot_budget}",
            f"hotline.sample_rate={setup.sample_rate}",
            f"hotline.relearn_every={relearn_every}",
            "hotline.slow_tier=disk",
            f"hotline.slow_tier_dir={out}",
            f"hotline.place_threads={setup.place_threads}",
        ],
    )


@dataclass
class System:
    """One way of training: its step, and the page-cache limit of its slow tier (if any)."""

    name: str
    step: Callable[[Batch], torch.Tensor]
    limit: PageCacheLimit | None = None
    hotline: HotlineTraining | None = None
    step_seconds: list[float] = field(default_factory=list)
    reclaim_seconds: list[float] = field(default_factory=list)
    disk_read_bytes: list[int] = field(default_factory=list)
    evicted_pages: list[int] = field(default_factory=list)

    def run(self, batch: Batch, record: bool) -> None:
        """One step, timed."""
        read = disk_read_bytes()
        started = time.perf_counter()
        float(self.step(batch))
        seconds = time.perf_counter() - started
        if record:
            self.step_seconds.append(seconds)
            self.disk_read_bytes.append(disk_read_bytes() - read)

    def reclaim(self, record: bool) -> None:
        """Enforce the page-cache limit, timed apart."""
        started = time.perf_counter()
        evicted = self.limit.reclaim() if self.limit is not None else 0
        if record:
            self.reclaim_seconds.append(time.perf_counter() - started)
            self.evicted_pages.append(evicted)

    def figures(self, batch_size: int) -> dict:
        step = float(np.median(self.step_seconds))
        with_reclaim = float(np.median(np.add(self.step_seconds, self.reclaim_seconds)))
        return {
            "samples_per_s": batch_size / step,
            "samples_per_s_with_reclaim": batch_size / with_reclaim,
            "median_ms_per_step": 1000 * step,
            "ms_per_step": [round(1000 * t, 1) for t in self.step_seconds],
            "reclaim_ms_per_step": 1000 * float(np.mean(self.reclaim_seconds)),
            "disk_read_kib_per_step": float(np.mean(self.disk_read_bytes)) / 1024,
            "evicted_pages_per_step": float(np.mean(self.evicted_pages)),
        }


def in_memory(setup: Setup, tables: list[TableConfig]) -> System:
    torch.manual_seed(setup.seed)
    model = build_model(model_config(setup), setup.num_dense, tables)
    return System("in_memory", TrainStep(model, make_optimizers(model, "sgd", LR)))


def slow_tier(setup: Setup, tables: list[TableConfig], out: Path, stack: ExitStack, readahead: bool = True) -> System:
    torch.manual_seed(setup.seed)
    model = build_model(model_config(setup), setup.num_dense, stand_in_tables(tables))
    init = stacked_rows_init(model.embeddings.initializer.for_tables(tables))  # the values (a) and (c) start from
    model.embeddings = embeddings = HotlineEmbeddingBagCollection(tables, init=init, slow="disk", directory=out, readahead=readahead)
    stack.callback(embeddings.close)
    limit = stack.enter_context(PageCacheLimit(embeddings.store.slow, parse_bytes(setup.page_cache, "--page-cache"), setup.seed))
    limit.evict_all()
    step = TrainStep(model, [*make_optimizers(model, "sgd", LR), TieredRowOptimizer(embeddings, lr=LR)])
    return System("slow_tier" if readahead else "slow_tier_fault_by_fault", step, limit)


def hotline(setup: Setup, tables: list[TableConfig], learn: list[Batch], out: Path, stack: ExitStack) -> System:
    torch.manual_seed(setup.seed)
    model = build_model(model_config(setup), setup.num_dense, stand_in_tables(tables))
    training = stack.enter_context(HotlineTraining(model, run_config(setup, out, relearn_every=0), len(learn), out, tables=tables))
    training.learn(learn)  # the learning phase's sampled mini-batches, without its (slow-tier speed) training
    page_cache = parse_bytes(setup.page_cache, "--page-cache") - training.stats()["fast_tier_bytes"]
    limit = stack.enter_context(PageCacheLimit(training.embeddings.store.slow, page_cache, setup.seed))
    limit.evict_all()
    return System("hotline", training.step, limit, training)


def measure(setup: Setup, tables: list[TableConfig], learn: list[Batch], batches: list[Batch], out: Path) -> dict:
    """Samples/s of the three systems, stepping them in turn on the same mini-batches."""
    with ExitStack() as stack:
        systems = [
            in_memory(setup, tables),
            slow_tier(setup, tables, out, stack),
            slow_tier(setup, tables, out, stack, readahead=False),
            hotline(setup, tables, learn, out, stack),
        ]

        def block(system: System) -> Callable[[int], None]:
            def run(r: int) -> None:
                for i in range(r * setup.block_steps, min((r + 1) * setup.block_steps, len(batches))):
                    record = i >= setup.warmup_steps
                    system.run(batches[i], record)
                    system.reclaim(record)

            return run

        rounds = -(-len(batches) // setup.block_steps)
        harness.interleaved_rounds({s.name: block(s) for s in systems}, rounds, shuffle_seed=setup.seed)  # no system always follows another
        result = {s.name: s.figures(setup.batch_size) for s in systems}
        stats = systems[-1].hotline.pipeline.stats
        result["hotline"].update(
            popular_fraction=stats.popular_fraction,
            hot_lookup_fraction=stats.hot_lookup_fraction,
            prefetch_wait_ms_per_step=1000 * stats.prefetch_wait_seconds / stats.steps,
            **{k: v for k, v in systems[-1].hotline.stats().items() if k.endswith(("bytes", "cpus")) or k == "hot_rows"},
        )
        return result


def drift(setup: Setup, out: Path, period_steps: int = 60, relearn_every: int = 20, batch_size: int = 1024) -> dict:
    """Popular fraction per mini-batch and per relearn window while the popular rows move every ``period_steps``."""
    data = SyntheticConfig(
        rows=3 * period_steps * batch_size, num_sparse=4, table_rows=20_000, zipf_exponent=setup.zipf_exponent,
        drift_period_rows=period_steps * batch_size, seed=setup.seed,
    )  # fmt: skip
    gen = SyntheticGenerator(data)
    dataset = Dataset.from_chunk(gen.generate(0, data.rows), gen.features, gen.dense_names, DataConfig(max_ind_range=data.table_rows))
    tables = dataset.tables(16)
    cfg = config.load(
        None,
        ["train.optimizer=sgd", f"hotline.hot_budget={4 * 4000 * (16 * 4 + 8)}", "hotline.sample_rate=0.5",
         f"hotline.relearn_every={relearn_every}", "hotline.slow_tier=host"],
        preset="tiny",
    )  # fmt: skip
    cfg.model.embedding_dim = 16
    torch.manual_seed(setup.seed)
    model = build_model(cfg.model, data.num_dense, stand_in_tables(tables))
    per_step, relearned_after = [], []  # popular fraction of mini-batch k; steps after which the hot set was re-learned
    with HotlineTraining(model, cfg, 3 * period_steps, out, tables=tables) as hotline:
        for k in range(3 * period_steps):
            before = dataclasses.replace(hotline.pipeline.stats)
            hotline.step(dataset.batch(np.arange(k * batch_size, (k + 1) * batch_size)))
            s = hotline.pipeline.stats
            per_step.append((s.popular_samples - before.popular_samples) / (s.samples - before.samples))
            if s.relearns > before.relearns:  # at the start of step k, before its split
                relearned_after.append(k)
    windows = [float(np.mean(per_step[i : i + relearn_every])) for i in range(0, len(per_step), relearn_every)]  # equal batch sizes
    per_period = period_steps // relearn_every
    settled, shifted, restored = windows[per_period - 1], windows[per_period], windows[per_period + 1]
    return {
        "relearn_every": relearn_every,
        "drift_period_steps": period_steps,
        "popular_fraction_per_step": per_step,
        "relearned_after_steps": relearned_after,
        "shifted_after_steps": list(range(period_steps, len(per_step), period_steps)),
        "popular_fraction_per_window": windows,
        "settled": settled,
        "after_shift": shifted,
        "one_relearn_later": restored,
        "restored": restored >= 0.9 * settled,
    }


def plot(systems: dict[str, dict], drift: dict | None, out: Path) -> None:
    """``hotline-speed.png``: samples/s and disk reads per step of every system; with the
    drift run, ``hotline-drift.png``: its popular fraction per mini-batch, re-learning and
    shifts marked."""
    harness.save_png(systems_figure(systems), out / "hotline-speed.png")
    if drift is not None:
        d = drift
        harness.save_png(
            popular_fraction_figure(d["popular_fraction_per_step"], d["relearned_after_steps"], d["shifted_after_steps"]), out / "hotline-drift.png"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_options(p, asdict(Setup()))
    p.add_argument("--no-drift", action="store_true", help="skip the drifting-popularity measurement")
    p.add_argument("--out", type=Path, default=Path("runs/bench-hotline"), help="folder for the JSON and PNG (and the slow tier's file)")
    args = p.parse_args()
    setup = Setup(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Setup)})
    parse_bytes(setup.hot_budget, "--hot-budget")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(setup.threads)
    torch.manual_seed(setup.seed)
    tables, batches = make_batches(setup, setup.learn_steps + setup.warmup_steps + setup.timed_steps)
    learn, measured = batches[: setup.learn_steps], batches[setup.learn_steps :]
    systems = measure(setup, tables, learn, measured, args.out)
    for name, figures in systems.items():
        print(f"{name:>10}: {figures['samples_per_s']:9,.0f} samples/s  {json.dumps(figures)}", flush=True)
    result = {
        "setup": asdict(setup),
        "table_bytes": setup.table_bytes,
        "page_cache_bytes": parse_bytes(setup.page_cache, "--page-cache"),
        "ratio_vs_slow_tier": systems["hotline"]["samples_per_s"] / systems["slow_tier"]["samples_per_s"],
        "ratio_vs_in_memory": systems["hotline"]["samples_per_s"] / systems["in_memory"]["samples_per_s"],
        "ratio_vs_slow_tier_fault_by_fault": systems["hotline"]["samples_per_s"] / systems["slow_tier_fault_by_fault"]["samples_per_s"],
        "ratio_readahead_slow_tier": systems["slow_tier"]["samples_per_s"] / systems["slow_tier_fault_by_fault"]["samples_per_s"],
        "ceiling_ratio_vs_slow_tier": systems["in_memory"]["samples_per_s"] / systems["slow_tier"]["samples_per_s"],
        "ratio_vs_slow_tier_with_reclaim": systems["hotline"]["samples_per_s_with_reclaim"] / systems["slow_tier"]["samples_per_s_with_reclaim"],
        "ratio_vs_in_memory_with_reclaim": systems["hotline"]["samples_per_s_with_reclaim"] / systems["in_memory"]["samples_per_s"],
        "popular_fraction": systems["hotline"]["popular_fraction"],
    }
    print(
        f"hotline / slow tier {result['ratio_vs_slow_tier']:.2f}x (in-memory speed would give {result['ceiling_ratio_vs_slow_tier']:.2f}x; "
        f"fault by fault {result['ratio_vs_slow_tier_fault_by_fault']:.2f}x), "
        f"hotline / in memory {result['ratio_vs_in_memory']:.2f}x",
        flush=True,
    )
    if not args.no_drift:
        result["drift"] = drift(setup, args.out)
        d = result["drift"]
        print(f"drift: popular {d['settled']:.2f} settled, {d['after_shift']:.2f} after the shift, {d['one_relearn_later']:.2f} one relearn later")
    plot(systems, result.get("drift"), args.out)
    measured = [
        harness.SystemResult(name, "step time", "ms", harness.Samples(figures["ms_per_step"]), {k: v for k, v in figures.items() if k != "ms_per_step"})
        for name, figures in systems.items()
    ]
    harness.finish(harness.ResultRecord("hotline", measured, result["ratio_vs_slow_tier"], result), args.out / "hotline-speed.json")


if __name__ == "__main__":
    main()
