"""DMT quality: AUC of DLRM, SPTT-DLRM and DMT-DLRM (TP and naive towers) over several seeds.

For each data set and seed, on one process:

- ``dlrm``: the DLRM baseline (distrec.models), trained and evaluated on a held-out split;
- ``sptt_dlrm``: SPTT changes only how embeddings travel, and equals the flat exchange in
  values and gradients (tests/test_parallel_sptt_embedding.py), so its AUC is dlrm's;
- ``dmt_tp``: DMT-DLRM (``model.tower_module=dlrm``, built by ``build_model`` as
  ``distrec train --tower-module dlrm`` builds it) with towers from the tower partitioner
  (coherent, pairwise interaction) on this seed's trained DLRM;
- ``dmt_naive``: the same with the strided assignment, feature i in tower i % T.

DMT-DLRM is trained on one process: ``distrec train --lookup sptt --tower-module`` on H
hosts computes the same model, its losses and weights equal the single-process run's to
float rounding (tests/test_train_dmt.py), and 5 seeds x 4 processes do not fit this
2-core machine's time budget.

Prints a table (mean and standard deviation over seeds) and, last, one JSON object with
every AUC; writes OUT/dmt_quality.json and OUT/dmt_quality.png.

    python benchmarks/dmt_quality.py                         # MovieLens + Criteo samples, 5 seeds
    python benchmarks/dmt_quality.py --quick                 # 2 seeds, 1 epoch
    python benchmarks/dmt_quality.py --datasets movielens --seeds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

import harness

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
DATASETS = {
    # name: (format, path, towers, max_ratio, epochs)
    "movielens": ("movielens", SHARED / "movielens", 2, 2.0, 2),
    "criteo": ("criteo", SHARED / "criteo" / "criteo_kaggle_sample.tsv", 4, 1.5, 4),
}
MODELS = ("dlrm", "sptt_dlrm", "dmt_tp", "dmt_naive")


def train(model, dataset, rows, epochs: int, batch_size: int, seed: int, lr: float, embedding_lr: float) -> None:
    """``epochs`` passes over ``rows`` with distrec's training step (Adam, lazy Adam for the tables)."""
    from distrec.train.optim import make_optimizers
    from distrec.train.step import TrainStep

    step = TrainStep(model, make_optimizers(model, "adam", lr, "adam", embedding_lr))
    model.train()
    for epoch in range(epochs):
        for batch in dataset.batches(rows, batch_size, shuffle=True, seed=seed, epoch=epoch):
            step(batch)


def run_dataset(name: str, args: argparse.Namespace) -> dict[str, list[float]]:
    from distrec import config
    from distrec.data import Dataset, prepare
    from distrec.models.build import build_model
    from distrec.models.dmt import tower_spec
    from distrec.models.dmt_cost import dmt_cost
    from distrec.models.tower_modules import compression_ratio
    from distrec.towers.from_run import pairwise_interaction
    from distrec.towers.partition import partition_features, resolve_towers
    from distrec.train.evaluate import evaluate

    fmt, path, towers, max_ratio, epochs = DATASETS[name]
    epochs = 1 if args.quick else epochs
    overrides = [f'data.format="{fmt}"', f'data.path="{path}"', f"model.embedding_dim={args.dim}", "model.bottom_mlp=[64]", "model.top_mlp=[64]"]
    cfg = config.load(None, overrides, preset="tiny")
    dataset = Dataset(prepare(cfg.data, progress=False), cfg.data)
    tables = dataset.tables(args.dim)
    split = dataset.split("random:0.2", seed=0)
    names = [t.name for t in tables]
    dmt_model = dataclasses.replace(cfg.model, tower_module="dlrm", tower_dim=args.dim // 2)
    spec = tower_spec(dmt_model, [])
    device = torch.device("cpu")
    auc: dict[str, list[float]] = {m: [] for m in MODELS}
    info: dict = {"model_size": dmt_cost(dmt_model, dataset.num_dense, tables, resolve_towers(names, None, towers))}
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        dlrm = build_model(cfg.model, dataset.num_dense, tables)
        train(dlrm, dataset, split["train"], epochs, args.batch_size, seed, args.lr, args.embedding_lr)
        auc["dlrm"].append(evaluate(dlrm, dataset, split["val"], 8192, device)["auc"])
        auc["sptt_dlrm"].append(auc["dlrm"][-1])
        sample = dataset.batch(split["train"][np.random.default_rng(seed).permutation(len(split["train"]))[:2048]])
        dlrm.eval()
        interaction = pairwise_interaction(dlrm, sample, seed)
        layouts = {
            "dmt_tp": partition_features(names, towers, "coherent", interaction, max_ratio, seed=seed),
            "dmt_naive": partition_features(names, towers, "naive"),
        }
        for model_name, part in layouts.items():
            torch.manual_seed(seed)
            feature_towers = part.feature_indices(names)
            dmt = build_model(dmt_model, dataset.num_dense, tables, towers=feature_towers)
            train(dmt, dataset, split["train"], epochs, args.batch_size, seed, args.lr, args.embedding_lr)
            auc[model_name].append(evaluate(dmt, dataset, split["val"], 8192, device)["auc"])
            info[f"{model_name}_towers_seed{seed}"] = part.towers
        print(f"dmt_quality: {name} seed {seed}: " + json.dumps({m: v[-1] for m, v in auc.items()}), file=sys.stderr, flush=True)
    counts = [len(t) for t in part.feature_indices(names)]
    info["compression"] = compression_ratio(spec, counts, args.dim)
    info["epochs"] = epochs
    return {"auc": auc, **info}


def plot(results: dict, path: Path) -> None:
    fig, axes = harness.figure(len(results), width=8 / len(results), height=3.5)
    for ax, (name, r) in zip(axes, results.items()):
        means = [np.mean(r["auc"][m]) for m in MODELS]
        harness.bars(ax, MODELS, {"AUC": means}, "AUC (mean, std over seeds)", errors={"AUC": [np.std(r["auc"][m]) for m in MODELS]})
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.set_ylim(min(means) - 0.03, max(means) + 0.02)
        ax.set_title(name)
    harness.save_png(fig, path)


def main(argv: list[str] | None = None) -> dict:
    from distrec.sim.report import format_table

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--dim", type=int, default=16, help="embedding dimension N (tower modules use N / 2)")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--embedding-lr", type=float, default=0.01)
    p.add_argument("--quick", action="store_true", help="2 seeds, 1 epoch")
    p.add_argument("--out", default="runs/dmt_quality")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds = min(args.seeds, 2)
    results = {name: run_dataset(name, args) for name in args.datasets}
    rows = []
    for name, r in results.items():
        size = r["model_size"]
        row = {
            "data": name,
            "towers": DATASETS[name][2],
            "CR": r["compression"],
            "params_dlrm": size["baseline_dense_parameters"],
            "params_dmt": size["dense_parameters"],
            "MFLOPs_dlrm": size["baseline_mflops_per_sample"],
            "MFLOPs_dmt": size["mflops_per_sample"],
        }
        for m in MODELS:
            row[m] = f"{np.mean(r['auc'][m]):.4f} ± {np.std(r['auc'][m]):.4f}"
        rows.append(row)
    print(format_table(rows))
    out = Path(args.out)
    summary = {"seeds": args.seeds, "results": results}
    plot(results, out / "dmt_quality.png")
    return harness.finish(summary, out / "dmt_quality.json")


if __name__ == "__main__":
    main()
