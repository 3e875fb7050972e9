"""DMT quality (the DMT paper's Table 4): AUC of DLRM, DMT-DLRM, DCN and DMT-DCN over several seeds.

For each data set, compression ratio and seed, on one process:

- ``dlrm`` and ``dcn``: the baselines (distrec.models);
- ``dmt_dlrm`` and ``dmt_dcn``: the same models with DMT's towers (``model.tower_module``
  ``dlrm`` and ``dcn``, built by ``build_model`` as ``distrec train --tower-module`` builds
  them): the tower modules compress each tower's pooled embeddings about CR x, and DLRM's
  interaction, DCN's cross and deep networks run on their outputs. The towers come from the
  tower partitioner (coherent, pairwise interaction) on this seed's trained baseline of the
  same architecture, as the paper's DMT models use TP towers.

Every model trains for up to the data set's epochs (harness.train_epochs) and is taken at its
best validation AUC (early stopping, as ``distrec train`` keeps ``best/``); its AUC on the
held-out test rows is reported. Models that converge at different speeds are so compared
each at its best, not at one fixed epoch count that favours the faster one.

The DMT models are trained on one process: ``distrec train --lookup sptt --tower-module``
on H hosts computes the same model, its losses and weights equal the single-process run's
to float rounding (tests/test_train_dmt.py, for DLRM and DCN), and 5 seeds x 4 processes do
not fit this 2-core machine's time budget. SPTT without tower modules equals the flat
exchange exactly, so SPTT-DLRM's AUC is DLRM's and is not listed.

Prints a table (mean and standard deviation over seeds; DMT - baseline paired by seed, with
a paired t-test and a Wilcoxon signed-rank test) and, last, the harness's result record (one
system per data set, compression ratio and model, its test AUC per seed) with ``auc_mean`` per
data set, compression ratio and model, ``dmt_minus_baseline`` (the paired differences),
``partitioner_p_value_vs_naive`` per data set (benchmarks/tower_partitioner.py's
``partitioner_study`` over ``--partitioner-seeds`` seeds, towers ``tp`` vs ``naive`` only:
two-sided Mann-Whitney, as the paper's Table 6; its DMT-DLRM sends only mixed vectors
across hosts, c = 0, p = 1, formed with the tower's own dot products, where the tower
choice decides what survives compression: docs/dmt.md), and every AUC under ``results``.
Writes OUT/dmt_quality.json and OUT/dmt_quality.png.

    python benchmarks/dmt_quality.py --compression 2 4          # MovieLens + Criteo samples, 5 seeds, 10 partitioner seeds
    python benchmarks/dmt_quality.py --quick                    # 2 seeds, 1 epoch, 2 partitioner seeds
    python benchmarks/dmt_quality.py --datasets movielens --partitioner-seeds 0
    python benchmarks/dmt_quality.py --partitioner-datasets movielens criteo planted
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import harness
import tower_partitioner

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
DATASETS = {
    # name: (format, path, towers, max_ratio, max_epochs)
    "movielens": ("movielens", SHARED / "movielens", 2, 2.0, 5),
    "criteo": ("criteo", SHARED / "criteo" / "criteo_kaggle_sample.tsv", 4, 1.5, 10),
}
# baseline architecture: (preset, --set items; the DMT form adds model.tower_module=<its name>)
ARCHS = {
    "dlrm": ("tiny", ["model.bottom_mlp=[64]", "model.top_mlp=[64]"]),
    "dcn": ("dcn", ["model.deep_mlp=[64]"]),
}
MODELS = ("dlrm", "dmt_dlrm", "dcn", "dmt_dcn")


def model_config(arch: str, fmt: str, path: Path, dim: int, tower_module: str | None = None, compression: float = 4.0):
    """The run config of ``arch`` on one data set, with DMT's tower modules when ``tower_module`` is set."""
    from distrec import config

    preset, items = ARCHS[arch]
    overrides = [f'data.format="{fmt}"', f'data.path="{path}"', f"model.embedding_dim={dim}", *items]
    if tower_module is not None:
        overrides += [f'model.tower_module="{tower_module}"', f"model.tower_compression={compression}", "parallel.hosts=2", "parallel.ranks_per_host=1"]
    return config.load(None, overrides, preset=preset)


@dataclass
class Trained:
    """A model trained with early stopping: its test AUC at the epoch it was taken at (counted
    from 1), and its validation AUC after every epoch."""

    test_auc: float
    epoch: int
    val_auc: list[float]


def train_best(model, dataset, split: dict[str, np.ndarray], max_epochs: int, seed: int, args: argparse.Namespace) -> Trained:
    """Train ``model`` for up to ``max_epochs`` epochs and leave it at the epoch of its best
    validation AUC (early stopping, as ``distrec train`` keeps ``best/``); its test AUC there."""
    from distrec.train.evaluate import evaluate

    device = torch.device("cpu")
    best: dict = {"val": -1.0}
    curve: list[float] = []

    def after_epoch(epoch: int) -> None:
        val = evaluate(model, dataset, split["val"], 8192, device)["auc"]
        curve.append(val)
        if val > best["val"]:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best.update(val=val, epoch=epoch, state=state, test=evaluate(model, dataset, split["test"], 8192, device)["auc"])

    harness.train_epochs(model, dataset, split["train"], max_epochs, args.batch_size, seed, args.lr, args.embedding_lr, after_epoch=after_epoch)
    model.load_state_dict(best["state"])
    model.eval()
    return Trained(best["test"], best["epoch"], curve)


def run_dataset(name: str, args: argparse.Namespace) -> dict:
    from distrec.data import Dataset, prepare
    from distrec.models.build import build_model
    from distrec.models.dmt_cost import dmt_cost
    from distrec.towers.from_run import pairwise_interaction
    from distrec.towers.partition import partition_features

    fmt, path, num_towers, max_ratio, max_epochs = DATASETS[name]
    max_epochs = 1 if args.quick else args.max_epochs or max_epochs
    base_cfg = {arch: model_config(arch, fmt, path, args.dim) for arch in ARCHS}
    dataset = Dataset(prepare(base_cfg["dlrm"].data, progress=False), base_cfg["dlrm"].data)
    tables = dataset.tables(args.dim)
    split = dataset.split(args.split, seed=0)
    if "test" not in split:
        raise SystemExit(f"dmt_quality: --split {args.split} has no test part; give random:VAL:TEST")
    names = [t.name for t in tables]
    auc: dict[str, dict[str, list[float]]] = {str(cr): {m: [] for m in MODELS} for cr in args.compression}
    epochs: dict[str, dict[str, list[int]]] = {str(cr): {m: [] for m in MODELS} for cr in args.compression}
    curves: dict[str, dict[str, list[list[float]]]] = {str(cr): {m: [] for m in MODELS} for cr in args.compression}
    cost: dict[str, dict[str, dict]] = {str(cr): {} for cr in args.compression}
    for seed in range(args.seeds):
        sample = dataset.batch(split["train"][np.random.default_rng(seed).permutation(len(split["train"]))[: args.sample_rows]])
        for arch in ARCHS:
            torch.manual_seed(seed)
            baseline = build_model(base_cfg[arch].model, dataset.num_dense, tables)
            trained = train_best(baseline, dataset, split, max_epochs, seed, args)
            interaction = pairwise_interaction(baseline, sample, seed)
            towers = partition_features(names, num_towers, "coherent", interaction, max_ratio, seed=seed).feature_indices(names)
            for cr in args.compression:
                auc[str(cr)][arch].append(trained.test_auc)
                epochs[str(cr)][arch].append(trained.epoch)
                curves[str(cr)][arch].append(trained.val_auc)
                dmt_cfg = model_config(arch, fmt, path, args.dim, arch, cr).model
                torch.manual_seed(seed)
                dmt = build_model(dmt_cfg, dataset.num_dense, tables, towers=towers)
                dmt_trained = train_best(dmt, dataset, split, max_epochs, seed, args)
                auc[str(cr)][f"dmt_{arch}"].append(dmt_trained.test_auc)
                epochs[str(cr)][f"dmt_{arch}"].append(dmt_trained.epoch)
                curves[str(cr)][f"dmt_{arch}"].append(dmt_trained.val_auc)
                cost[str(cr)][arch] = dmt_cost(dmt_cfg, dataset.num_dense, tables, towers)
        latest = {cr: {m: round(v[-1], 4) for m, v in by_model.items()} for cr, by_model in auc.items()}
        print(f"dmt_quality: {name} seed {seed}: {json.dumps(latest)}", file=sys.stderr, flush=True)
    return {
        "auc": auc,
        "best_epoch": epochs,
        "val_auc_per_epoch": curves,
        "cost": cost,
        "towers": num_towers,
        "max_epochs": max_epochs,
        "rows": {k: len(v) for k, v in split.items()},
    }


def paired_difference(dmt: list[float], base: list[float]) -> dict:
    """DMT - baseline AUC, paired by seed: mean, sd (ddof 1), and the two-sided p-values of a
    paired t-test and a Wilcoxon signed-rank test (None with fewer than 2 seeds)."""
    from scipy.stats import ttest_rel, wilcoxon

    diff = np.asarray(dmt) - np.asarray(base)
    enough = len(diff) > 1 and np.any(diff != 0)
    return {
        "mean": float(diff.mean()),
        "sd": float(diff.std(ddof=1)) if len(diff) > 1 else 0.0,
        "p_paired_t": float(ttest_rel(dmt, base).pvalue) if enough else None,
        "p_wilcoxon": float(wilcoxon(dmt, base).pvalue) if enough else None,
    }


def plot(results: dict, path: Path) -> None:
    panels = [(name, cr) for name, r in results.items() for cr in r["auc"]]
    fig, axes = harness.figure(len(panels), width=8 / len(panels) + 2, height=3.5)
    for ax, (name, cr) in zip(axes, panels):
        by_model = results[name]["auc"][cr]
        means = [np.mean(by_model[m]) for m in MODELS]
        harness.bars(ax, MODELS, {"AUC": means}, "AUC (mean, std over seeds)", errors={"AUC": [np.std(by_model[m]) for m in MODELS]})
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.set_ylim(min(means) - 0.03, max(means) + 0.02)
        ax.set_title(f"{name}, CR {cr}")
    harness.save_png(fig, path)


def table_rows(results: dict) -> list[dict]:
    """One row per data set, compression ratio and architecture: baseline vs DMT (AUC mean ±
    sd over seeds, mean early-stopping epoch), their paired difference, and cost."""
    rows = []
    for name, r in results.items():
        for cr, by_model in r["auc"].items():
            for arch in ARCHS:
                base, dmt, cost = by_model[arch], by_model[f"dmt_{arch}"], r["cost"][cr][arch]
                diff = paired_difference(dmt, base)
                rows.append(
                    {
                        "data": name,
                        "model": arch,
                        "CR asked": float(cr),
                        "CR": round(cost["compression"], 2),
                        "AUC": f"{np.mean(base):.4f} ± {np.std(base, ddof=1) if len(base) > 1 else 0:.4f}",
                        "AUC DMT": f"{np.mean(dmt):.4f} ± {np.std(dmt, ddof=1) if len(dmt) > 1 else 0:.4f}",
                        "DMT - base": f"{diff['mean']:+.4f} ± {diff['sd']:.4f}",
                        "p (t / W)": "-" if diff["p_paired_t"] is None else f"{diff['p_paired_t']:.2g} / {diff['p_wilcoxon']:.2g}",
                        "epochs": f"{np.mean(r['best_epoch'][cr][arch]):.1f} / {np.mean(r['best_epoch'][cr][f'dmt_{arch}']):.1f}",
                        "params": f"{cost['baseline_dense_parameters']:,} / {cost['dense_parameters']:,}",
                        "MFLOPs": f"{cost['baseline_mflops_per_sample']:.3f} / {cost['mflops_per_sample']:.3f}",
                    }
                )
    return rows


def partitioner_p_values(args: argparse.Namespace) -> dict[str, dict]:
    """benchmarks/tower_partitioner.py's study with its towers ``tp`` and ``naive`` only: per
    data set, their AUC mean and sd over ``--partitioner-seeds`` seeds and the two-sided
    Mann-Whitney p-value of tp vs naive."""
    options = tower_partitioner.StudyOptions(tower_c=0, tower_interaction=True, epochs=1 if args.quick else None)
    study = tower_partitioner.partitioner_study(args.partitioner_datasets or args.datasets, args.partitioner_seeds, options, ("tp", "naive"))
    return {
        name: {
            "seeds": args.partitioner_seeds,
            "auc_mean": {m: r["mean"][m] for m in ("tp", "naive")},
            "auc_sd": {m: r["sd"][m] for m in ("tp", "naive")},
            "p_value_vs_naive": r["p_value_vs_naive"],
        }
        for name, r in study.items()
    }


def main(argv: list[str] | None = None) -> dict:
    from distrec.sim.report import format_table

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--compression", nargs="+", type=float, default=[4.0], metavar="CR", help="tower-module compression ratios (default 4)")
    p.add_argument("--max-epochs", type=int, default=None, help="epochs at most (default: each data set's own); the best validation epoch is kept")
    p.add_argument("--split", default="random:0.1:0.2", help="validation (early stopping) and test fractions")
    p.add_argument("--sample-rows", type=int, default=512, help="training rows the partitioner's pairwise interaction is measured on")
    p.add_argument("--dim", type=int, default=16, help="embedding dimension N")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--embedding-lr", type=float, default=0.01)
    p.add_argument("--partitioner-seeds", type=int, default=10, help="seeds of the tower partitioner vs naive towers test (0: skip it; p-values null)")
    p.add_argument("--partitioner-datasets", nargs="+", default=None, choices=list(tower_partitioner.DATASETS), help="its data sets (default: --datasets)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (on a loaded machine, more threads wait on each other)")
    p.add_argument("--quick", action="store_true", help="2 seeds, 1 epoch, 2 partitioner seeds")
    p.add_argument("--out", default="runs/dmt_quality")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.seeds, args.partitioner_seeds = min(args.seeds, 2), min(args.partitioner_seeds, 2)
    results = {name: run_dataset(name, args) for name in args.datasets}
    print(format_table(table_rows(results)))
    partitioner = partitioner_p_values(args) if args.partitioner_seeds > 0 else {}
    out = Path(args.out)
    plot(results, out / "dmt_quality.png")
    summary = {
        "seeds": args.seeds,
        "auc_mean": {name: {cr: {m: float(np.mean(v)) for m, v in by_model.items()} for cr, by_model in r["auc"].items()} for name, r in results.items()},
        "dmt_minus_baseline": {
            name: {cr: {arch: paired_difference(by_model[f"dmt_{arch}"], by_model[arch]) for arch in ARCHS} for cr, by_model in r["auc"].items()}
            for name, r in results.items()
        },
        "partitioner_p_value_vs_naive": {name: partitioner.get(name, {}).get("p_value_vs_naive") for name in [*results, *partitioner]},
        "partitioner": partitioner,
        "results": results,
    }
    systems = [
        harness.SystemResult(f"{name}, CR {cr}, {model}", "test AUC", "AUC", harness.Samples(aucs))
        for name, r in results.items()
        for cr, by_model in r["auc"].items()
        for model, aucs in by_model.items()
    ]
    return harness.finish(harness.ResultRecord("dmt_quality", systems, None, summary), out / "dmt_quality.json")


if __name__ == "__main__":
    main()
