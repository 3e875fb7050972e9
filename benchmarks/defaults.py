"""Out of the box: ``distrec train`` with only ``--data`` and ``--data-format`` against the tuned configs.

For each real sample and seed, interleaved, ``distrec train`` runs

- ``defaults``: ``--data PATH --data-format FORMAT --seed S`` and nothing else (the run
  picks the optimizers, the batch size and, by early stopping, the length), on its own
  default holdout (a random 10%);
- ``defaults_tuned_split``: the same on the tuned config's holdout (``--split`` of the
  config), so the comparison with the tuned config scores the same rows (MovieLens's tuned
  split is the default one, so it is not run twice);
- ``tuned``: ``--config configs/<name>.yaml``;
- ``old_defaults``: what the defaults were before (SGD lr 0.1 for everything, batch 1,024,
  one epoch), for reference;

and, on the default synthetic data set, ``defaults`` and ``old_defaults`` too. Prints a
table; the last line is the harness's result record (one system per data set and variant,
its holdout AUC per seed) with, per data set and variant, the holdout AUC of every seed, its mean and standard deviation, the steps trained, and
``defaults_minus_tuned`` (mean AUC, same holdout). Writes OUT/defaults.json and
OUT/defaults.png.

    python benchmarks/defaults.py                       # seeds 0-4, about 15 minutes on 2 idle cores
    python benchmarks/defaults.py --datasets criteo --seeds 0
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
DATASETS = {
    # name: (data arguments, tuned config or None, the tuned config's split)
    "criteo": (["--data", str(SHARED / "criteo" / "criteo_kaggle_sample.tsv"), "--data-format", "criteo"], "criteo-sample.yaml", "last:0.2"),
    "movielens": (["--data", str(SHARED / "movielens"), "--data-format", "movielens"], "movielens.yaml", None),
    "synthetic": ([], None, None),
}
OLD_DEFAULTS = ["--optimizer", "sgd", "--lr", "0.1", "--batch-size", "1024", "--epochs", "1"]


def variants(name: str) -> dict[str, list[str]]:
    """Variant -> ``distrec train`` arguments for data set ``name``."""
    data, config, tuned_split = DATASETS[name]
    runs = {"defaults": data}
    if tuned_split is not None:
        runs["defaults_tuned_split"] = [*data, "--split", tuned_split]
    if config is not None:
        runs["tuned"] = [*data, "--config", str(ROOT / "configs" / config)]
    runs["old_defaults"] = [*data, *OLD_DEFAULTS]
    return runs


def run_dataset(name: str, seeds: list[int], out: Path, threads: int) -> dict:
    runs = variants(name)
    result: dict = {variant: {"auc": [], "steps": [], "stopped": []} for variant in runs}
    for seed in seeds:
        for variant, arguments in runs.items():
            run = harness.distrec_train(
                out / name / f"{variant}-seed{seed}",
                [*arguments, "--seed", str(seed), *harness.set_items([f"train.threads={threads}"])],
                cache_dir=out / "cache",
            )
            for key in ("auc", "steps", "stopped"):
                result[variant][key].append(run.summary[key])
            print(f"{name:10s} seed {seed} {variant:22s} AUC {run.summary['auc']:.4f}  {run.summary['steps']:5d} steps  ({run.summary['stopped']})", flush=True)
    for r in result.values():
        r["auc_mean"] = statistics.fmean(r["auc"])
        r["auc_std"] = statistics.stdev(r["auc"]) if len(seeds) > 1 else 0.0
    if "tuned" in result:
        same_holdout = result.get("defaults_tuned_split", result["defaults"])
        result["defaults_minus_tuned"] = same_holdout["auc_mean"] - result["tuned"]["auc_mean"]
    return result


def plot(results: dict, path: Path) -> None:
    """Mean holdout AUC (with the seeds' spread) of every variant, per data set."""
    names = list(results)
    labels = ["old_defaults", "defaults", "defaults_tuned_split", "tuned"]
    series = {v: [results[n][v]["auc_mean"] if v in results[n] else 0.0 for n in names] for v in labels}
    errors = {v: [results[n][v]["auc_std"] if v in results[n] else 0.0 for n in names] for v in labels}
    fig, (ax,) = harness.figure(width=7)
    harness.bars(ax, names, series, "holdout AUC (mean of seeds)", errors)
    ax.set_ylim(0.5, 0.85)
    ax.set_title("distrec train with only --data: defaults vs tuned configs")
    harness.save_png(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="training seeds (default 0-4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1: the runs are small)")
    parser.add_argument("--out", default="runs/defaults", help="where runs, defaults.json and defaults.png go")
    args = parser.parse_args()

    out = Path(args.out)
    results = {name: run_dataset(name, args.seeds, out, args.threads) for name in args.datasets}
    print()
    for name, r in results.items():
        row = "  ".join(f"{v} {r[v]['auc_mean']:.4f} +- {r[v]['auc_std']:.4f}" for v in variants(name))
        delta = f"  defaults - tuned {r['defaults_minus_tuned']:+.4f}" if "defaults_minus_tuned" in r else ""
        print(f"{name:10s} {row}{delta}")
    plot(results, out / "defaults.png")
    systems = [
        harness.SystemResult(f"{name}, {variant}", "holdout AUC", "AUC", harness.Samples(r[variant]["auc"]))
        for name, r in results.items()
        for variant in variants(name)
    ]
    harness.finish(harness.ResultRecord("defaults", systems, None, results), out / "defaults.json")


if __name__ == "__main__":
    main()
