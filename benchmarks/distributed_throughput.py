"""Distributed training throughput: 1, 2 and 4 processes, every sharding type, on this machine.

The reference configuration of ``train_throughput.py`` (batch 2048, 26 tables x 100,000 rows x dim 64, 13
dense features, bottom MLP 13-512-256-64, top MLP 512-256-1, dot interaction, SGD) trained by
``distrec train`` itself: one process, then ``--nproc-per-node N`` with table-, column-,
row-wise and data-parallel tables, and independent (``local``) embeddings. Each run writes its
``breakdown.json``; throughput is the global batch over the mean step time (after 5 warm-up
steps), and every figure is a ratio against the one-process run measured in the same
invocation. Bytes are what rank 0 sends per step in each exchange. The breakdowns are also
drawn into one PNG (one stacked bar per configuration). With ``--rounds R`` every
configuration runs R times, the configurations in turns, and the round with the median step
time is reported. The last line printed is the harness's result record (every
configuration's samples/s per round) with every figure, also written to
OUT/distributed_throughput.json.

Usage:
    python benchmarks/distributed_throughput.py                    # ~5 minutes on 2 cores
    python benchmarks/distributed_throughput.py --procs 2 --steps 20 --pooling-factor 20
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import harness
from distrec.components.breakdown import COMPONENTS
from distrec.report import plot_breakdowns

SHARDINGS = ("table_wise", "column_wise", "row_wise", "data_parallel")


def reference_overrides(pooling_factor: int, steps: int, batch_size: int) -> list[str]:
    """``section.key=value`` items of the reference configuration (``train_throughput.py``'s) on synthetic data."""
    return [
        f"data.synthetic.rows={batch_size * (steps + 2)}",
        "data.synthetic.num_sparse=26",
        "data.synthetic.table_rows=100000",
        "data.max_ind_range=100000",
        f"data.synthetic.pooling_factor={pooling_factor}",
        "data.split=random:0.01",
        "model.embedding_dim=64",
        "model.bottom_mlp=[512,256]",
        "model.top_mlp=[512,256]",
        "model.interaction=dot",
        f"train.batch_size={batch_size}",
        f"train.max_steps={steps}",
        "train.optimizer=sgd",
        "train.lr=0.01",
    ]


def run_config(label: str, procs: int, extra: list[str], args: argparse.Namespace, round_index: int) -> dict:
    """Train one configuration with the CLI; its figures from breakdown.json and summary.json."""
    out = Path(args.out) / label / f"round{round_index}"
    overrides = harness.set_items(reference_overrides(args.pooling_factor, args.steps, args.batch_size))
    run = harness.distrec_train(out, [*overrides, *extra], procs, cache_dir=Path(args.out) / "cache")
    step_ms = run.step_ms(COMPONENTS)
    result = {
        "procs": procs,
        "samples_per_s": args.batch_size / step_ms * 1e3,
        "step_ms": step_ms,
        "breakdown_ms": {c: round(run.breakdown["components"][c]["mean_ms"], 2) for c in COMPONENTS},
        "bytes_per_step": run.breakdown["bytes_per_step"],
        "wall_s": run.wall_s,
        "run": str(out),
    }
    print(f"  {label:<22} {result['samples_per_s']:>9,.0f} samples/s  step {step_ms:7.1f} ms", file=sys.stderr, flush=True)
    return result


def median_round(rounds: list[dict]) -> dict:
    """The figures of the round with the median step time, with every round's samples/s."""
    middle = sorted(rounds, key=lambda r: r["step_ms"])[(len(rounds) - 1) // 2]
    return {**middle, "samples_per_s_per_round": [round(r["samples_per_s"]) for r in rounds]}


def configurations(procs: list[int]) -> list[tuple[str, int, list[str]]]:
    """(label, processes, extra CLI arguments) of every configuration, the baseline first."""
    out = [("1p", 1, [])]
    for n in procs:
        out += [(f"{n}p-{s}", n, ["--sharding", s]) for s in SHARDINGS]
        out.append((f"{n}p-local", n, ["--embeddings", "local"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4], help="process counts besides 1 (default 2 4)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per configuration (default 30)")
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--pooling-factor", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every configuration, in turns; the median round is reported (default 1)")
    parser.add_argument("--out", default="runs/bench-distributed", help="folder for the runs, the cache and the PNG")
    args = parser.parse_args()
    systems = {label: partial(run_config, label, procs, extra, args) for label, procs, extra in configurations(args.procs)}
    results = {label: median_round(rounds) for label, rounds in harness.interleaved_rounds(systems, args.rounds).items()}
    base = results["1p"]["samples_per_s"]
    for r in results.values():
        r["ratio"] = round(r["samples_per_s"] / base, 3)
    png = plot_breakdowns([Path(r["run"]) for r in results.values()], Path(args.out) / "breakdown.png", statistic="mean_ms")
    print(f"\n{'configuration':<22} {'samples/s':>10} {'ratio':>6} {'a2a in KB':>10} {'a2a out KB':>11} {'allreduce KB':>13}")
    for label, r in results.items():
        b = r["bytes_per_step"]
        print(
            f"{label:<22} {r['samples_per_s']:>10,.0f} {r['ratio']:>6.2f} {b['input_all_to_all'] / 1e3:>10,.0f} "
            f"{b['output_all_to_all'] / 1e3:>11,.0f} {b['gradient_all_reduce'] / 1e3:>13,.0f}"
        )
    systems = [harness.SystemResult(label, "throughput", "samples/s", harness.Samples(r["samples_per_s_per_round"])) for label, r in results.items()]
    extra = {"config": vars(args), "baseline": "1p", "plot": str(png), "runs": results}
    harness.finish(harness.ResultRecord("distributed_throughput", systems, None, extra), Path(args.out) / "distributed_throughput.json")


if __name__ == "__main__":
    main()
