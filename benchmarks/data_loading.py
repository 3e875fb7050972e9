"""The loader against the training step: mini-batches per second from the cache, and what one
training process consumes.

Two data sets, both prepared into distrec's cache through its public API:

- ``criteo``: 1 index per bag. ``--files`` synthetic Criteo-format TSV files (``synthesize``,
  distinct seeds, ``--rows`` rows in all), prepared as one data set of several files, so
  every shuffled batch gathers from all of them;
- ``pooling20``: 20 indices per bag (multi-hot). The synthetic data set with
  ``pooling_factor=20`` (``--rows-pooled`` rows), prepared into one cache.

For each data set and batch size (``--batch-sizes``) each round measures, in turns:

- ``loader``: ``Dataset.batches(train rows, B, shuffle=True)``, the training loop's loader
  (its background threads, ``data.loader_threads`` of them, build ``distrec.data.batch.Batch``
  objects: raw ids gathered and mapped into the tables, bag offsets, dense features and
  labels), consumed without work: batches per second over ``--loader-batches`` batches after
  the first;
- ``train_step``: ``TrainStep`` (the training step ``distrec train`` runs) of the default
  model (preset dlrm-kaggle, embedding dim 16, tables of ``max_ind_range`` 100,000 rows,
  Adam for the dense layers and row-wise Adagrad for the tables, as ``distrec train``
  chooses) on batches of the same shape: steps per second over ``--train-steps`` steps
  after ``--warmup-steps``, with all cores and ``OMP_WAIT_POLICY=PASSIVE``, as the ``distrec``
  command sets it (the script starts itself again with it when it is unset).

``headroom`` is loader batches/s over training steps/s: how many training processes like this
one the loader feeds; ``bottleneck_step_ms`` is the loader's ms per batch, the step time
below which (a faster accelerator) the loader would limit training. The last line printed is
the result JSON, also written to ``--out``.

Usage:
    python benchmarks/data_loading.py
    python benchmarks/data_loading.py --batch-sizes 2048 --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import harness
from distrec import config
from distrec.components.optim import make_optimizers
from distrec.components.step import TrainStep
from distrec.config import DataConfig, SyntheticConfig
from distrec.data import Dataset, prepare, synthesize
from distrec.models.build import build_model

SETUP = {
    "rows": 600_000,
    "files": 4,
    "rows_pooled": 100_000,
    "batch_sizes": [2048, 65536],
    "rounds": 5,
    "loader_batches": 8,
    "train_steps": 2,
    "warmup_steps": 1,
    "seed": 0,
}
HELPS = {
    "rows": "rows of the 1-index-per-bag Criteo set, split evenly over --files files",
    "files": "files of the Criteo set",
    "rows_pooled": "rows of the 20-indices-per-bag data set",
    "batch_sizes": "batch sizes measured",
    "rounds": "interleaved rounds of loader and training step; medians are over them",
    "loader_batches": "batches timed per loader measurement (after the first)",
    "train_steps": "training steps timed per measurement",
    "warmup_steps": "training steps before timing",
    "seed": "seed of the shuffles and the model",
}
POOLING = 20


def criteo_set(folder: Path, rows: int, files: int) -> DataConfig:
    """``files`` Criteo TSV files of ``rows`` rows in all; the data config naming them."""
    folder.mkdir()
    for k in range(files):
        synthesize(SyntheticConfig(rows=rows // files, seed=100 + k), folder / f"day_{k}.tsv", progress=False)
    return DataConfig(path=str(folder), format="criteo")


def pooled_set(rows: int) -> DataConfig:
    return DataConfig(format="synthetic", synthetic=SyntheticConfig(rows=rows, pooling_factor=POOLING))


def loader_rate(dataset: Dataset, batch_size: int, batches: int, epoch: int) -> float:
    """Batches per second of the loader in steady state: over ``batches`` batches after the
    first (the threads' start). The training rows are the data set's, repeated until a pass
    holds that many batches (a pass over the small pooled data set holds 2 batches of 65,536)."""
    rows = np.resize(np.arange(dataset.num_rows, dtype=np.int64), max(dataset.num_rows, (batches + 1) * batch_size))
    stream = dataset.batches(rows, batch_size, shuffle=True, seed=0, epoch=epoch)
    next(stream)
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    seconds = time.perf_counter() - start
    stream.close()
    return batches / seconds


def train_rate(step: TrainStep, batches: list, warmup: int, steps: int) -> float:
    """Training steps per second on ``batches`` (cycled), after ``warmup`` untimed steps."""
    for k in range(warmup):
        step(batches[k % len(batches)])
    start = time.perf_counter()
    for k in range(steps):
        step(batches[k % len(batches)])
    return steps / (time.perf_counter() - start)


def measure(name: str, dataset: Dataset, args: argparse.Namespace) -> dict:
    """Loader and training step, interleaved, for every batch size of one data set."""
    tables = dataset.tables(config.ModelConfig().embedding_dim)
    results = {}
    for b in args.batch_sizes:
        torch.manual_seed(args.seed)
        model = build_model(config.ModelConfig(), dataset.num_dense, tables)
        chosen = config.chosen_optimizers(config.TrainConfig())
        step = TrainStep(model, make_optimizers(model, chosen.optimizer, chosen.lr, chosen.embedding_optimizer, chosen.embedding_lr))
        batches = [dataset.batch(np.random.default_rng([args.seed, k]).choice(dataset.num_rows, b, replace=False)) for k in range(2)]
        systems: dict[str, Callable[[int], float]] = {
            "loader": lambda r, b=b: loader_rate(dataset, b, args.loader_batches, r),
            "train_step": lambda r: train_rate(step, batches, args.warmup_steps if r == 0 else 0, args.train_steps),
        }
        rates = harness.interleaved_rounds(systems, args.rounds)
        loader, train = harness.Samples(rates["loader"]), harness.Samples(rates["train_step"])
        results[str(b)] = {
            "loader_batches_per_s": loader.summary(2),
            "loader_samples_per_s": round(loader.median * b),
            "train_steps_per_s": train.summary(3),
            "train_samples_per_s": round(train.median * b),
            "headroom": round(loader.median / train.median, 1),
            "bottleneck_step_ms": round(1000 / loader.median, 2),
        }
        print(f"{name} B={b}: {results[str(b)]}", file=sys.stderr, flush=True)
    return results


def main() -> None:
    if "OMP_WAIT_POLICY" not in os.environ:  # the distrec command sets it before torch loads (cli/__init__.py): run as it runs
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_options(parser, SETUP, HELPS)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-data/data-loading.json"), help="result JSON")
    args = parser.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory(prefix="distrec-bench-loading-") as tmp:
        started = time.perf_counter()
        sets = {
            "criteo": criteo_set(Path(tmp) / "criteo", args.rows, args.files),
            f"pooling{POOLING}": pooled_set(args.rows_pooled),
        }
        datasets = {name: Dataset(prepare(cfg, Path(tmp) / "cache", progress=False), cfg) for name, cfg in sets.items()}
        print(f"prepared the data sets in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        data = {
            name: {"rows": d.num_rows, "files": len(d.file_starts) - 1, "indices_per_bag": POOLING if name != "criteo" else 1} for name, d in datasets.items()
        }
        results = {name: measure(name, dataset, args) for name, dataset in datasets.items()}
    result = {
        "benchmark": "data_loading",
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.date.today().isoformat(),
        "cpus": len(os.sched_getaffinity(0)),
        "setup": {name: getattr(args, name) for name in SETUP},
        "data": data,
        "model": "preset dlrm-kaggle, embedding dim 16, 26 tables of 100,000 rows, adam + row-wise adagrad",
        "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
        "results": results,
        "min_headroom": min(r["headroom"] for by_batch in results.values() for r in by_batch.values()),
    }
    harness.finish(result, args.out)


if __name__ == "__main__":
    main()
