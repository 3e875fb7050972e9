"""Quality on the real samples: distrec's dlrm-kaggle model against a hashed logistic regression.

For each data set, distrec trains with the settings in ``configs/<name>.yaml`` (the
``dlrm-kaggle`` architecture) once per seed, and the baseline is fitted on the same split:

- ``criteo``: the Criteo Kaggle sample, last 20% of the rows held out (time-ordered), so
  the split is the same for every seed;
- ``movielens``: MovieLens-100k (80,000 ratings, label = rating >= 4), a random 10% held
  out, drawn with the run's seed, so the baseline is refitted on each seed's split.

The baseline (``lr``) is scikit-learn's LogisticRegression (default C=1, lbfgs) on one-hot
categorical features hashed into the same table rows distrec uses, plus the dense features
standardised on the training rows. ``lr_best_c`` is the same model with C picked from a
grid by its AUC on the holdout itself: an optimistic bound for any tuned LR.

Prints a table, then (last line) the harness's result record (distrec and the LR per data set,
their holdout AUC per seed) with, per data set, the distrec AUC of every seed, its mean and standard deviation, the LR AUCs, ``gain`` = distrec mean - LR mean, with
``gain_std`` the standard deviation of the per-seed (paired) gains, and ``seeds_won``.
Writes OUT/quality.json and OUT/quality.png.

    python benchmarks/quality.py                      # both data sets, seeds 0 1 2
    python benchmarks/quality.py --quick              # seed 0 only
    python benchmarks/quality.py --datasets criteo --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

import harness

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
DATASETS = {
    # name: (config file, data path)
    "criteo": (ROOT / "configs" / "criteo-sample.yaml", SHARED / "criteo" / "criteo_kaggle_sample.tsv"),
    "movielens": (ROOT / "configs" / "movielens.yaml", SHARED / "movielens"),
}
# inverse L2 strengths tried for lr_best_c
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def hashed_features(dataset, rows: np.ndarray):
    """(one-hot CSR [n, sum of table rows], dense float [n, n_dense], labels [n]) of ``rows``."""
    import scipy.sparse as sp

    batch = dataset.batch(rows)
    n = len(rows)
    lengths = batch.lengths().numpy().reshape(-1)  # feature-major [F * n]
    first_column = np.cumsum([0] + [dataset.table_rows[f.name] for f in dataset.features])
    columns = batch.sparse_values.numpy() + np.repeat(np.repeat(first_column[:-1], n), lengths)
    samples = np.repeat(np.tile(np.arange(n), len(dataset.features)), lengths)
    one_hot = sp.csr_matrix((np.ones(columns.size), (samples, columns)), shape=(n, int(first_column[-1])))
    return one_hot, batch.dense.numpy().astype(np.float64), batch.labels.numpy()


def logistic_regression_aucs(dataset, splits: dict[str, np.ndarray]) -> dict[str, float]:
    """Holdout AUC of the hashed LR at C=1 (``lr``) and at the best C of ``C_GRID`` (``lr_best_c``)."""
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    train_hot, train_dense, train_labels = hashed_features(dataset, splits["train"])
    val_hot, val_dense, val_labels = hashed_features(dataset, splits["val"])
    # only rows seen in training get a weight (L2 keeps the others at 0): same model, far fewer columns
    seen = np.flatnonzero(train_hot.getnnz(axis=0))
    train_hot, val_hot = train_hot[:, seen], val_hot[:, seen]
    mean, std = train_dense.mean(0), train_dense.std(0) + 1e-9
    x_train = sp.hstack([train_hot, sp.csr_matrix((train_dense - mean) / std)]).tocsr()
    x_val = sp.hstack([val_hot, sp.csr_matrix((val_dense - mean) / std)]).tocsr()
    aucs = {}
    for c in C_GRID:
        model = LogisticRegression(C=c, max_iter=5000).fit(x_train, train_labels)
        aucs[c] = float(roc_auc_score(val_labels, model.predict_proba(x_val)[:, 1]))
    best = max(aucs, key=aucs.get)
    return {"lr": aucs[1.0], "lr_best_c": aucs[best], "best_c": best}


def run_dataset(name: str, seeds: list[int], out: Path, threads: int) -> dict:
    from distrec import config
    from distrec.data import Dataset, prepare
    from distrec.train.loop import train
    from distrec.train.run import split_rows

    config_file, path = DATASETS[name]
    result: dict = {"config": str(config_file.relative_to(ROOT)), "seeds": seeds, "auc": [], "lr": [], "lr_best_c": []}
    lr_by_split: dict[bytes, dict] = {}
    for seed in seeds:
        cfg = config.load(config_file, [f'data.path="{path}"', f"train.seed={seed}", f"train.threads={threads}"])
        summary = train(cfg, out / f"{name}-seed{seed}", progress=False)
        dataset = Dataset(prepare(cfg.data, progress=False), cfg.data)
        splits = split_rows(dataset, cfg)
        key = splits["val"].tobytes()
        if key not in lr_by_split:  # a position-based split is the same for every seed
            lr_by_split[key] = logistic_regression_aucs(dataset, splits)
        lr = lr_by_split[key]
        result["auc"].append(summary["auc"])
        result["lr"].append(lr["lr"])
        result["lr_best_c"].append(lr["lr_best_c"])
        print(
            f"{name:10s} seed {seed}: distrec AUC {summary['auc']:.4f}   LR (C=1) {lr['lr']:.4f}   LR (best C={lr['best_c']}) {lr['lr_best_c']:.4f}", flush=True
        )
    for key in ("auc", "lr", "lr_best_c"):
        result[f"{key}_mean"] = statistics.fmean(result[key])
    result["auc_std"] = statistics.stdev(result["auc"]) if len(seeds) > 1 else 0.0
    result["gain"] = result["auc_mean"] - result["lr_mean"]
    # paired by seed (the MovieLens split changes with the seed, and the LR is refitted on it)
    gains = [auc - lr for auc, lr in zip(result["auc"], result["lr"])]
    result["gain_std"] = statistics.stdev(gains) if len(seeds) > 1 else 0.0
    result["seeds_won"] = sum(g > 0 for g in gains)
    result["gain_over_best_c"] = result["auc_mean"] - result["lr_best_c_mean"]
    return result


def plot(results: dict, path: Path) -> None:
    """Bars: distrec AUC (mean, with the seeds' spread) beside the two LR baselines, per data set."""
    names = list(results)
    x = np.arange(len(names))
    fig, (ax,) = harness.figure(width=6)
    bars = [("distrec dlrm-kaggle", "auc_mean", "auc_std"), ("hashed LR, C=1", "lr_mean", None), ("hashed LR, best C", "lr_best_c_mean", None)]
    for i, (label, key, err) in enumerate(bars):
        values = [results[n][key] for n in names]
        errors = [results[n][err] for n in names] if err else None
        ax.bar(x + (i - 1) * 0.27, values, 0.27, yerr=errors, capsize=3, label=label)
    ax.set_xticks(x, names)
    ax.set_ylim(0.5, 1.0)
    ax.set_ylabel("holdout AUC")
    ax.set_title("distrec vs hashed logistic regression (same split)")
    ax.legend(loc="upper left")
    harness.save_png(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="training seeds (default 0 1 2)")
    parser.add_argument("--quick", action="store_true", help="seed 0 only")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1: the runs are small)")
    parser.add_argument("--out", default="runs/quality", help="where runs, quality.json and quality.png go")
    args = parser.parse_args()

    seeds = [0] if args.quick else args.seeds
    out = Path(args.out)
    results = {name: run_dataset(name, seeds, out, args.threads) for name in args.datasets}
    print()
    print(f"{'data set':10s} {'distrec AUC':>18s} {'LR C=1':>8s} {'LR best C':>10s} {'paired gain':>18s} {'seeds won':>9s}")
    for name, r in results.items():
        print(
            f"{name:10s} {r['auc_mean']:.4f} +- {r['auc_std']:.4f} {r['lr_mean']:8.4f} {r['lr_best_c_mean']:10.4f} "
            f"{r['gain']:+.4f} +- {r['gain_std']:.4f} {r['seeds_won']:>6d}/{len(r['auc'])}"
        )
    plot(results, out / "quality.png")
    systems = [
        harness.SystemResult(f"{name}, {system}", "holdout AUC", "AUC", harness.Samples(r[key]))
        for name, r in results.items()
        for system, key in (("distrec", "auc"), ("hashed LR, C=1", "lr"))
    ]
    harness.finish(harness.ResultRecord("quality", systems, None, results), out / "quality.json")


if __name__ == "__main__":
    main()
