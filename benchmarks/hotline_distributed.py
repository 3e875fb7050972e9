"""Distributed Hotline: all-to-all bytes saved by replicating the hot rows, on this machine.

Trains the same model on the same Zipf-distributed synthetic batches with ``distrec train
--nproc-per-node N``: first the ordinary sharded trainer (every lookup through the
all-to-all), then ``--hotline`` at several hot budgets (hot rows replicated on every rank,
popular micro-batches with no all-to-all, the other micro-batch sending only its cold
indices). Bytes are what rank 0 sent in its embedding all-to-alls (input and output) over
all training steps, the learning phase (before the first hot set) included; the ratio is
Hotline's bytes over the sharded trainer's. The replicated hot rows cost all-reduce bytes
instead (one lookup count per hot row, and the gradients of the hot rows some rank looked
up), so the gradient all-reduces are compared too (the sharded trainer's: the dense
gradients, every step), and the total of both kinds of traffic. With ``--rounds R`` every
run is repeated R times, the runs in turns, and the median round's samples/s is reported.
The last line printed is one JSON object with every figure, also written to
OUT/hotline_distributed.json.

Usage:
    python benchmarks/hotline_distributed.py                       # ~3 minutes on 2 cores
    python benchmarks/hotline_distributed.py --procs 4 --budgets 1MB 8MB
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import harness


def overrides(args: argparse.Namespace) -> list[str]:
    """``section.key=value`` items of the data set and model shared by every run."""
    return [
        f"data.synthetic.rows={args.batch_size * (args.steps + 2)}",
        f"data.synthetic.num_sparse={args.tables}",
        f"data.synthetic.table_rows={args.table_rows}",
        f"data.max_ind_range={args.table_rows}",
        f"data.synthetic.zipf_exponent={args.zipf}",
        "data.split=random:0.01",
        f"model.embedding_dim={args.dim}",
        "model.bottom_mlp=[64]",
        "model.top_mlp=[64]",
        f"train.batch_size={args.batch_size}",
        f"train.max_steps={args.steps}",
        "train.optimizer=sgd",
        "train.lr=0.01",
        "train.threads=1",
    ]


def train(label: str, extra: list[str], args: argparse.Namespace, round_index: int) -> dict:
    """One ``distrec train`` run; its summary, with ``dense_all_reduce_bytes`` per step."""
    out = Path(args.out) / label / f"round{round_index}"
    arguments = ["--sharding", args.sharding, *harness.set_items(overrides(args)), *extra]
    run = harness.distrec_train(out, arguments, args.procs, cache_dir=Path(args.out) / "cache")
    summary = {**run.summary, "dense_all_reduce_bytes": run.breakdown["bytes_per_step"]["gradient_all_reduce"]}
    print(f"  {label:<16} {summary['samples_per_s']:>9,.0f} samples/s  all-to-all {summary['all_to_all_bytes'] / 1e6:8.1f} MB", file=sys.stderr, flush=True)
    return summary


def median_round(rounds: list[dict]) -> dict:
    """The summary of the round with the median samples/s (bytes are the same in every round)."""
    return sorted(rounds, key=lambda s: s["samples_per_s"])[(len(rounds) - 1) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sharding", default="table_wise", choices=["table_wise", "column_wise", "row_wise"])
    defaults = dict(procs=2, budgets=["256KB", "1MB", "4MB"], steps=60, batch_size=4096, tables=8, table_rows=100_000, dim=16, zipf=1.05,
                    sample_rate=0.5, relearn_every=10, rounds=1)  # fmt: skip
    harness.add_options(parser, defaults, {
        "budgets": "hot budgets (bytes of the replicated table)",
        "rounds": "rounds of every run, in turns; the median round's samples/s is reported (default 1)",
    })  # fmt: skip
    parser.add_argument("--out", default="runs/bench-hotline-distributed", help="folder for the runs and the cache")
    args = parser.parse_args()
    hotline = ["--hotline", "--sample-rate", str(args.sample_rate), "--relearn-every", str(args.relearn_every)]
    systems = {"sharded": partial(train, "sharded", [], args)}
    systems.update({f"hotline-{budget}": partial(train, f"hotline-{budget}", [*hotline, "--hot-budget", budget], args) for budget in args.budgets})
    summaries = {label: median_round(rounds) for label, rounds in harness.interleaved_rounds(systems, args.rounds).items()}
    base = summaries["sharded"]
    base_reduce = base["dense_all_reduce_bytes"] * args.steps
    runs = {
        "sharded": {
            "samples_per_s": base["samples_per_s"],
            "all_to_all_bytes": base["all_to_all_bytes"],
            "all_reduce_bytes": base_reduce,
            "total_bytes": base["all_to_all_bytes"] + base_reduce,
        }
    }
    for budget in args.budgets:
        s = summaries[f"hotline-{budget}"]
        h = s["hotline"]
        total = s["all_to_all_bytes"] + h["all_reduce_bytes"]
        runs[f"hotline-{budget}"] = {
            "samples_per_s": s["samples_per_s"],
            "all_to_all_bytes": s["all_to_all_bytes"],
            "bytes_ratio_vs_sharded": round(s["all_to_all_bytes"] / base["all_to_all_bytes"], 4),
            "throughput_ratio_vs_sharded": round(s["samples_per_s"] / base["samples_per_s"], 3),
            "popular_fraction": round(h["popular_fraction"], 4),
            "hot_lookup_fraction": round(h["hot_lookup_fraction"], 4),
            "hot_rows": h["hot_rows"],
            "all_reduce_bytes": h["all_reduce_bytes"],
            "total_bytes": total,
            "total_bytes_ratio_vs_sharded": round(total / runs["sharded"]["total_bytes"], 4),
        }
    print(f"\n{'run':<16} {'samples/s':>10} {'a2a MB':>9} {'a2a ratio':>10} {'all-reduce MB':>14} {'total ratio':>12} {'popular':>8} {'hot lookups':>12}")
    for label, r in runs.items():
        print(
            f"{label:<16} {r['samples_per_s']:>10,.0f} {r['all_to_all_bytes'] / 1e6:>9.1f} {r.get('bytes_ratio_vs_sharded', 1.0):>10.3f} "
            f"{r['all_reduce_bytes'] / 1e6:>14.1f} {r.get('total_bytes_ratio_vs_sharded', 1.0):>12.3f} "
            f"{r.get('popular_fraction', 0.0):>8.3f} {r.get('hot_lookup_fraction', 0.0):>12.3f}"
        )
    harness.finish({"config": vars(args), "baseline": "sharded", "runs": runs}, Path(args.out) / "hotline_distributed.json")


if __name__ == "__main__":
    main()
