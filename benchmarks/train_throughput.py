"""Training throughput of distrec against plain PyTorch, on Criteo-shaped synthetic data.

The configuration is the project's reference workload: batch 2048, 26 tables x 100,000 rows x dim 64,
13 dense features, bottom MLP 13-512-256-64, top MLP 415-512-256-1, dot interaction,
pooling factor 1 (``--pooling-factor 20`` for multi-hot bags). Systems:

- ``baseline``: DLRM as a new PyTorch user writes it: one ``nn.EmbeddingBag`` per table with
  dense gradients, the interaction as ``bmm`` + index, ``torch.optim.SGD`` on all parameters;
- ``distrec-<optimizer>``: ``build_model`` + ``make_optimizers`` + ``TrainStep`` with
  sgd, adagrad (row-wise for embeddings) or adam (lazy for embeddings).

Each measurement runs in a fresh worker process (so no system inherits another's allocator
state, caches or threads) and takes the median of per-step times (the harness's clock for
the device); the workers of one repeat run back to back, repeats interleave the systems, and
the median over repeats is reported, so ratios compare systems measured under the same
machine load. The data (Zipf indices from ``distrec.data.synthetic``) is generated before
timing starts. The last line printed is the harness's result record with every figure:
``ratio`` is distrec-sgd over the baseline, ``ratio_adagrad`` and ``ratio_adam`` the other
optimizers over the same baseline, and each system's figures under its name.

Usage:
    python benchmarks/train_throughput.py                       # all optimizers, pooling 1
    python benchmarks/train_throughput.py --pooling-factor 20 --optimizer sgd --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import harness
from distrec.components.optim import OPTIMIZER_NAMES, make_optimizers
from distrec.components.step import TrainStep
from distrec.config import DataConfig, ModelConfig, SyntheticConfig
from distrec.data.batch import Batch
from distrec.data.dataset import Dataset
from distrec.data.synthetic import SyntheticGenerator
from distrec.models.build import build_model
from distrec.models.mlp import mlp
from distrec.tables import TableConfig

# learning rates do not change the speed; these are the usual defaults of each optimizer
LEARNING_RATES = {"sgd": 0.01, "adagrad": 0.01, "adam": 0.001}


@dataclass
class Setup:
    """The benchmark configuration (units: samples, rows, floats)."""

    batch_size: int = 2048
    num_tables: int = 26
    table_rows: int = 100_000
    dim: int = 64
    num_dense: int = 13
    bottom_mlp: list[int] = field(default_factory=lambda: [512, 256])
    top_mlp: list[int] = field(default_factory=lambda: [512, 256])
    pooling_factor: int = 1
    zipf_exponent: float = 1.05
    num_batches: int = 8
    warmup_steps: int = 5
    timed_steps: int = 20
    threads: int = os.cpu_count() or 1
    seed: int = 1234


def make_data(setup: Setup) -> tuple[list[TableConfig], list[Batch]]:
    """Tables and ``num_batches`` in-memory batches of synthetic Zipf-distributed data."""
    cfg = SyntheticConfig(
        rows=setup.batch_size * setup.num_batches,
        num_dense=setup.num_dense,
        num_sparse=setup.num_tables,
        table_rows=setup.table_rows,
        zipf_exponent=setup.zipf_exponent,
        pooling_factor=setup.pooling_factor,
        seed=setup.seed,
    )
    gen = SyntheticGenerator(cfg)
    dataset = Dataset.from_chunk(gen.generate(0, cfg.rows), gen.features, gen.dense_names, DataConfig(max_ind_range=setup.table_rows))
    b = setup.batch_size
    batches = [dataset.batch(np.arange(i * b, (i + 1) * b)) for i in range(setup.num_batches)]
    return dataset.tables(setup.dim), batches


class PlainDLRM(nn.Module):
    """The baseline: DLRM written the straightforward way (per-table bags, dense gradients)."""

    def __init__(self, setup: Setup, tables: list[TableConfig]) -> None:
        super().__init__()
        self.bottom = mlp([setup.num_dense, *setup.bottom_mlp, setup.dim], final_activation=True)
        self.tables = nn.ModuleList(nn.EmbeddingBag(t.num_rows, t.dim, mode="sum") for t in tables)
        n = len(tables) + 1
        self.rows, self.cols = torch.triu_indices(n, n, offset=1)
        self.top = mlp([setup.dim + n * (n - 1) // 2, *setup.top_mlp, 1])

    def forward(self, batch: Batch) -> torch.Tensor:
        x = self.bottom(batch.dense)
        b = batch.batch_size
        pooled = []
        for f, table in enumerate(self.tables):
            start = batch.sparse_offsets[f * b]
            pooled.append(table(batch.feature_values(f), batch.sparse_offsets[f * b : (f + 1) * b] - start))
        z = torch.stack([x, *pooled], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.rows, self.cols]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def baseline_step_fn(setup: Setup, tables: list[TableConfig]):
    """The baseline's training step (zero_grad, forward, loss, backward, SGD) and its optimizers."""
    model = PlainDLRM(setup, tables)
    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATES["sgd"])

    def step(batch: Batch) -> torch.Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(batch), batch.labels)
        loss.backward()
        opt.step()
        return loss.detach()

    return step, [opt]


def distrec_step_fn(setup: Setup, tables: list[TableConfig], optimizer: str):
    """distrec's training step with ``optimizer`` and its optimizers."""
    cfg = ModelConfig(embedding_dim=setup.dim, bottom_mlp=list(setup.bottom_mlp), top_mlp=list(setup.top_mlp), interaction="dot")
    model = build_model(cfg, setup.num_dense, tables)
    optimizers = make_optimizers(model, optimizer, LEARNING_RATES[optimizer])
    return TrainStep(model, optimizers), optimizers


def state_bytes(optimizers: list[torch.optim.Optimizer]) -> int:
    """Bytes of the optimized parameters plus the optimizer state tensors."""
    params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
    total = sum(p.numel() * p.element_size() for p in params)
    for opt in optimizers:
        for state in opt.state.values():
            total += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
    return total


def current_rss_bytes() -> int:
    """Resident memory of this process now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(setup: Setup, system: str, optimizer: str) -> dict:
    """Build one system, warm up, then time ``timed_steps`` steps one by one.

    Returns samples/s at the median step time (robust to a step slowed by another
    process), peak RSS, RSS before the model was built, and parameter + state bytes.
    """
    torch.set_num_threads(setup.threads)
    torch.manual_seed(setup.seed)
    tables, batches = make_data(setup)
    rss_before = current_rss_bytes()
    if system == "baseline":
        step, optimizers = baseline_step_fn(setup, tables)
    else:
        step, optimizers = distrec_step_fn(setup, tables, optimizer)
    for i in range(setup.warmup_steps):
        step(batches[i % len(batches)])
    ms = harness.Samples([harness.timed_ms(lambda: float(step(batches[i % len(batches)])))[1] for i in range(setup.timed_steps)])
    return {
        "samples_per_s": setup.batch_size / ms.median * 1e3,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_before_model_bytes": rss_before,
        "state_bytes": state_bytes(optimizers),
    }


def run_worker(setup: Setup, system: str, optimizer: str, round_index: int) -> dict:
    """``measure`` in a fresh Python process."""
    return harness.run_worker(__file__, {"setup": asdict(setup), "system": system, "optimizer": optimizer})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizer", choices=[*OPTIMIZER_NAMES, "all"], default="all", help="distrec optimizer(s) to measure (default: all)")
    parser.add_argument("--pooling-factor", type=int, default=1, help="indices per bag (default 1)")
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3, help="measurements per system; the median is reported")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--timed-steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: all cores)")
    parser.add_argument(harness.WORKER_FLAG, dest="worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(measure(Setup(**spec["setup"]), spec["system"], spec["optimizer"])))
        return

    setup = Setup(
        batch_size=args.batch_size,
        pooling_factor=args.pooling_factor,
        warmup_steps=args.warmup_steps,
        timed_steps=args.timed_steps,
        threads=args.threads,
    )
    optimizers = list(OPTIMIZER_NAMES) if args.optimizer == "all" else [args.optimizer]
    systems = {"baseline": partial(run_worker, setup, "baseline", "sgd")} | {f"distrec-{o}": partial(run_worker, setup, "distrec", o) for o in optimizers}
    print(
        f"batch {setup.batch_size}, {setup.num_tables} tables x {setup.table_rows} rows x dim {setup.dim}, "
        f"pooling {setup.pooling_factor}, {setup.threads} threads, torch {torch.__version__}",
        flush=True,
    )

    runs: dict[str, list[dict]] = {name: [] for name in systems}

    def measured(name: str) -> Callable[[int], None]:
        return lambda r: runs[name].append(systems[name](r))

    def report(r: int) -> None:
        for name, results in runs.items():
            print(f"  repeat {r + 1}/{args.repeats} {name:16s} {results[-1]['samples_per_s']:9.0f} samples/s", flush=True)

    harness.interleaved_rounds({name: measured(name) for name in systems}, args.repeats, after_round=report)

    summary: dict = {
        "config": asdict(setup),
        "torch": torch.__version__,
        "baseline_description": "plain PyTorch, nn.EmbeddingBag per table, dense gradients, torch.optim.SGD",
    }
    speeds = {name: harness.Samples([r["samples_per_s"] for r in results]) for name, results in runs.items()}
    base = speeds["baseline"].median
    print(f"\n{'system':16s} {'samples/s':>10s} {'ratio':>6s} {'peak RSS MB':>12s} {'params+state MB':>16s} {'extra RSS / state':>18s}")
    for name, results in runs.items():
        speed = speeds[name].median
        peak = max(r["peak_rss_bytes"] for r in results)
        state = results[0]["state_bytes"]
        extra = (peak - min(r["rss_before_model_bytes"] for r in results)) / state
        print(f"{name:16s} {speed:10.0f} {speed / base:6.2f} {peak / 2**20:12.0f} {state / 2**20:16.0f} {extra:18.2f}")
        summary[name] = {
            "samples_per_s": round(speed),
            "samples_per_s_repeats": [round(r["samples_per_s"]) for r in results],
            "peak_rss_bytes": peak,
            "state_bytes": state,
            "rss_over_state": round(extra, 3),
        }
    ratios = {optimizer: round(summary[f"distrec-{optimizer}"]["samples_per_s"] / base, 3) for optimizer in optimizers}
    summary |= {f"ratio_{optimizer}": ratio for optimizer, ratio in ratios.items() if optimizer != "sgd"}
    results = [harness.SystemResult(name, "throughput", "samples/s", samples) for name, samples in speeds.items()]
    harness.finish(harness.ResultRecord("train_throughput", results, ratios.get("sgd"), summary))


if __name__ == "__main__":
    main()
