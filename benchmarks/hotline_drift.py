"""How far Hotline's losses drift from ordinary training's, beside the drift a thread count alone causes.

Runs ``distrec train`` with the per-step loss logged (``train.log_every=1``) and the default
optimizers (Adam for the dense layers, row-wise Adagrad for the rows) for the same steps:

- ``plain``, 1 and 2 torch threads (``train.threads``): ordinary training, twice, differing
  only in how the kernels split their sums over threads;
- ``hotline``, 1 and 2 threads: the same with ``--hotline`` (the hot set re-learned every
  ``--relearn-every`` steps, rows moving between the tiers each time);
- ``plain``/``hotline`` at ``--batch-size 1``, 1 thread: one sample per mini-batch is
  never split into a popular and a non-popular micro-batch, so Hotline sums every gradient
  in ordinary training's order: any difference left there would be a real one.

For each pair it reports the maximum |loss difference| in every window of ``--window`` steps,
the first step whose losses differ at all and the first that differ by more than 1e-6, and
the difference of the final validation AUCs. Prints one line per pair; the last line is the
harness's result record (one system per pair, its window maxima as rounds). Writes
OUT/hotline-drift.json.

    python benchmarks/hotline_drift.py                    # MovieLens, 300 steps: about 2 min on 2 idle cores
    python benchmarks/hotline_drift.py --data-format synthetic --steps 100
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parents[1]
MOVIELENS = ROOT.parent / "shared" / "data" / "movielens"
LOSS_TOLERANCE = 1e-6  # "differ by more than": about 16 float32 ulps of a loss near 0.6


def step_losses(run: Path) -> list[float]:
    """The training loss of every step of a run logged with ``train.log_every=1``."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in records if r.get("split") == "train" and "loss" in r}
    return [losses[step] for step in range(1, len(losses) + 1)]


def compare(a: harness.TrainedRun, b: harness.TrainedRun, window: int) -> dict:
    """Per-window maxima of |loss difference| of two runs, the first steps that differ, and the AUC difference."""
    la, lb = step_losses(a.out), step_losses(b.out)
    diffs = [abs(x - y) for x, y in zip(la, lb, strict=True)]

    def first(above: float) -> int | None:
        return next((step for step, d in enumerate(diffs, 1) if d > above), None)

    return {
        "window_max": [max(diffs[i : i + window]) for i in range(0, len(diffs), window)],
        "first_differing_step": first(0.0),
        "first_step_above_1e-6": first(LOSS_TOLERANCE),
        "max_diff": max(diffs),
        "auc_diff": abs(a.summary["auc"] - b.summary["auc"]),
        "steps": len(diffs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-format", default="movielens", help="movielens (the sample beside the checkout) or synthetic")
    parser.add_argument("--data", default=str(MOVIELENS), help="the data (unused for synthetic)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--window", type=int, default=50, help="steps per window of the reported maxima")
    parser.add_argument("--hot-budget", default="1MB")
    parser.add_argument("--sample-rate", default="0.25")
    parser.add_argument("--relearn-every", default="25")
    parser.add_argument("--out", default="runs/hotline-drift", help="where the runs and hotline-drift.json go")
    args = parser.parse_args()

    out = Path(args.out)
    data = [] if args.data_format == "synthetic" else ["--data-format", args.data_format, "--data", args.data]
    common = [*data, "--max-steps", str(args.steps), *harness.set_items(["train.log_every=1"])]
    hotline = ["--hotline", "--hot-budget", args.hot_budget, "--sample-rate", args.sample_rate, "--relearn-every", args.relearn_every]

    def train(name: str, batch_size: int, threads: int, extra: list[str]) -> harness.TrainedRun:
        arguments = [*common, "--batch-size", str(batch_size), *harness.set_items([f"train.threads={threads}"]), *extra]
        return harness.distrec_train(out / name, arguments, cache_dir=out / "cache")

    b = args.batch_size
    runs = {
        "plain-1": train("plain-1", b, 1, []),
        "plain-2": train("plain-2", b, 2, []),
        "hotline-1": train("hotline-1", b, 1, hotline),
        "hotline-2": train("hotline-2", b, 2, hotline),
        "plain-b1": train("plain-b1", 1, 1, []),
        "hotline-b1": train("hotline-b1", 1, 1, hotline),
    }
    pairs = {
        "plain 1 thread vs plain 2 threads": ("plain-1", "plain-2"),
        "hotline vs plain, 1 thread": ("hotline-1", "plain-1"),
        "hotline vs plain, 2 threads": ("hotline-2", "plain-2"),
        "hotline vs plain, batch 1 (never split)": ("hotline-b1", "plain-b1"),
    }
    results = {name: compare(runs[a], runs[b_], args.window) for name, (a, b_) in pairs.items()}
    for name, r in results.items():
        windows = " ".join(f"{m:.1e}" for m in r["window_max"])
        print(
            f"{name:42s} first differing step {r['first_differing_step']}, above 1e-6 from {r['first_step_above_1e-6']}; "
            f"max |loss diff| per {args.window} steps: {windows}; |AUC diff| {r['auc_diff']:.1e}",
            flush=True,
        )
    systems = [
        harness.SystemResult(name, f"max |loss difference| per {args.window} steps", "loss", harness.Samples(r["window_max"])) for name, r in results.items()
    ]
    hot = runs["hotline-1"].summary["hotline"]
    extra = {
        "pairs": results,
        "relearns": {name: runs[name].summary["hotline"]["relearns"] for name in ("hotline-1", "hotline-b1")},
        "popular_fraction": hot["popular_fraction"],
        "auc": {name: run.summary["auc"] for name, run in runs.items()},
        "config": vars(args),
    }
    harness.finish(harness.ResultRecord("hotline_drift", systems, None, extra), out / "hotline-drift.json")


if __name__ == "__main__":
    main()
