"""DMT quality (the DMT paper's Table 4): AUC of DLRM, DMT-DLRM, DCN and DMT-DCN over several seeds.

For each data set, compression ratio and seed, on one process:

- ``dlrm`` and ``dcn``: the baselines (distrec.models), trained and evaluated on a held-out split;
- ``dmt_dlrm`` and ``dmt_dcn``: the same models with DMT's towers (``model.tower_module``
  ``dlrm`` and ``dcn``, built by ``build_model`` as ``distrec train --tower-module`` builds
  them): the tower modules compress each tower's pooled embeddings about CR x, and DLRM's
  interaction, DCN's cross and deep networks run on their outputs. The towers come from the
  tower partitioner (coherent, pairwise interaction) on this seed's trained baseline of the
  same architecture, as the paper's DMT models use TP towers.

The DMT models are trained on one process: ``distrec train --lookup sptt --tower-module``
on H hosts computes the same model, its losses and weights equal the single-process run's
to float rounding (tests/test_train_dmt.py, for DLRM and DCN), and 5 seeds x 4 processes do
not fit this 2-core machine's time budget. SPTT without tower modules equals the flat
exchange exactly, so SPTT-DLRM's AUC is DLRM's and is not listed.

Prints a table (mean and standard deviation over seeds) and, last, one JSON object:
``auc_mean`` per data set, compression ratio and model, every AUC under ``results``, and
``partitioner_p_value_vs_naive`` per data set, left null here: that test (tower partitioner
vs strided towers, Mann-Whitney, paper Table 6) is benchmarks/tower_partitioner.py's.
Writes OUT/dmt_quality.json and OUT/dmt_quality.png.

    python benchmarks/dmt_quality.py                         # MovieLens + Criteo samples, 5 seeds, CR 4
    python benchmarks/dmt_quality.py --quick                 # 2 seeds, 1 epoch
    python benchmarks/dmt_quality.py --datasets movielens --seeds 10 --compression 2 4
"""

from __future__ import annotations

import argparse
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
# baseline architecture: (preset, --set items; the DMT form adds model.tower_module=<its name>)
ARCHS = {
    "dlrm": ("tiny", ["model.bottom_mlp=[64]", "model.top_mlp=[64]"]),
    "dcn": ("dcn", ["model.deep_mlp=[64]"]),
}
MODELS = ("dlrm", "dmt_dlrm", "dcn", "dmt_dcn")


def train(model, dataset, rows, epochs: int, batch_size: int, seed: int, lr: float, embedding_lr: float) -> None:
    """``epochs`` passes over ``rows`` with distrec's training step (Adam, lazy Adam for the tables)."""
    from distrec.train.optim import make_optimizers
    from distrec.train.step import TrainStep

    step = TrainStep(model, make_optimizers(model, "adam", lr, "adam", embedding_lr))
    model.train()
    for epoch in range(epochs):
        for batch in dataset.batches(rows, batch_size, shuffle=True, seed=seed, epoch=epoch):
            step(batch)


def model_config(arch: str, fmt: str, path: Path, dim: int, tower_module: str | None = None, compression: float = 4.0):
    """The run config of ``arch`` on one data set, with DMT's tower modules when ``tower_module`` is set."""
    from distrec import config

    preset, items = ARCHS[arch]
    overrides = [f'data.format="{fmt}"', f'data.path="{path}"', f"model.embedding_dim={dim}", *items]
    if tower_module is not None:
        overrides += [f'model.tower_module="{tower_module}"', f"model.tower_compression={compression}", "parallel.hosts=2", "parallel.ranks_per_host=1"]
    return config.load(None, overrides, preset=preset)


def run_dataset(name: str, args: argparse.Namespace) -> dict:
    from distrec.data import Dataset, prepare
    from distrec.models.build import build_model
    from distrec.models.dmt_cost import dmt_cost
    from distrec.towers.from_run import pairwise_interaction
    from distrec.towers.partition import partition_features
    from distrec.train.evaluate import evaluate

    fmt, path, num_towers, max_ratio, epochs = DATASETS[name]
    epochs = 1 if args.quick else epochs
    base_cfg = {arch: model_config(arch, fmt, path, args.dim) for arch in ARCHS}
    dataset = Dataset(prepare(base_cfg["dlrm"].data, progress=False), base_cfg["dlrm"].data)
    tables = dataset.tables(args.dim)
    split = dataset.split("random:0.2", seed=0)
    names = [t.name for t in tables]
    device = torch.device("cpu")
    auc: dict[str, dict[str, list[float]]] = {str(cr): {m: [] for m in MODELS} for cr in args.compression}
    cost: dict[str, dict[str, dict]] = {str(cr): {} for cr in args.compression}
    for seed in range(args.seeds):
        sample = dataset.batch(split["train"][np.random.default_rng(seed).permutation(len(split["train"]))[: args.sample_rows]])
        for arch in ARCHS:
            torch.manual_seed(seed)
            baseline = build_model(base_cfg[arch].model, dataset.num_dense, tables)
            train(baseline, dataset, split["train"], epochs, args.batch_size, seed, args.lr, args.embedding_lr)
            baseline_auc = evaluate(baseline, dataset, split["val"], 8192, device)["auc"]
            baseline.eval()
            interaction = pairwise_interaction(baseline, sample, seed)
            towers = partition_features(names, num_towers, "coherent", interaction, max_ratio, seed=seed).feature_indices(names)
            for cr in args.compression:
                auc[str(cr)][arch].append(baseline_auc)
                dmt_cfg = model_config(arch, fmt, path, args.dim, arch, cr).model
                torch.manual_seed(seed)
                dmt = build_model(dmt_cfg, dataset.num_dense, tables, towers=towers)
                train(dmt, dataset, split["train"], epochs, args.batch_size, seed, args.lr, args.embedding_lr)
                auc[str(cr)][f"dmt_{arch}"].append(evaluate(dmt, dataset, split["val"], 8192, device)["auc"])
                cost[str(cr)][arch] = dmt_cost(dmt_cfg, dataset.num_dense, tables, towers)
        latest = {cr: {m: round(v[-1], 4) for m, v in by_model.items()} for cr, by_model in auc.items()}
        print(f"dmt_quality: {name} seed {seed}: {json.dumps(latest)}", file=sys.stderr, flush=True)
    return {"auc": auc, "cost": cost, "towers": num_towers, "epochs": epochs}


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
    """One row per data set, compression ratio and architecture: baseline vs DMT, AUC and cost."""
    rows = []
    for name, r in results.items():
        for cr, by_model in r["auc"].items():
            for arch in ARCHS:
                base, dmt, cost = by_model[arch], by_model[f"dmt_{arch}"], r["cost"][cr][arch]
                rows.append(
                    {
                        "data": name,
                        "model": arch,
                        "CR asked": float(cr),
                        "CR": round(cost["compression"], 2),
                        "AUC": f"{np.mean(base):.4f} ± {np.std(base):.4f}",
                        "AUC DMT": f"{np.mean(dmt):.4f} ± {np.std(dmt):.4f}",
                        "DMT - base": f"{np.mean(dmt) - np.mean(base):+.4f}",
                        "params": f"{cost['baseline_dense_parameters']:,} / {cost['dense_parameters']:,}",
                        "MFLOPs": f"{cost['baseline_mflops_per_sample']:.3f} / {cost['mflops_per_sample']:.3f}",
                    }
                )
    return rows


def main(argv: list[str] | None = None) -> dict:
    from distrec.sim.report import format_table

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--compression", nargs="+", type=float, default=[4.0], metavar="CR", help="tower-module compression ratios (default 4)")
    p.add_argument("--sample-rows", type=int, default=512, help="training rows the partitioner's pairwise interaction is measured on")
    p.add_argument("--dim", type=int, default=16, help="embedding dimension N")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--embedding-lr", type=float, default=0.01)
    p.add_argument("--quick", action="store_true", help="2 seeds, 1 epoch")
    p.add_argument("--out", default="runs/dmt_quality")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds = min(args.seeds, 2)
    results = {name: run_dataset(name, args) for name in args.datasets}
    print(format_table(table_rows(results)))
    out = Path(args.out)
    plot(results, out / "dmt_quality.png")
    summary = {
        "seeds": args.seeds,
        "auc_mean": {name: {cr: {m: float(np.mean(v)) for m, v in by_model.items()} for cr, by_model in r["auc"].items()} for name, r in results.items()},
        # filled by benchmarks/tower_partitioner.py (TP vs strided towers, Mann-Whitney), not here
        "partitioner_p_value_vs_naive": {name: None for name in results},
        "results": results,
    }
    return harness.finish(summary, out / "dmt_quality.json")


if __name__ == "__main__":
    main()
