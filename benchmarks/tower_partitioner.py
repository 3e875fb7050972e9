"""Tower partitioner evidence (DMT paper, Table 6): DMT-DLRM's AUC with towers from the
partitioner vs strided vs random towers, over seeds, with Mann-Whitney U tests.

For each data set and seed, on one process:

1. a DLRM (distrec.models) is trained on the training split; the partitioner reads its
   feature interactions on ``--sample-rows`` training rows;
2. one DMT-DLRM per tower method is trained from the same seed (same table initialisation,
   same batch order) and evaluated on the held-out split (AUC).

Tower methods (``METHODS``):

- ``tp``: distrec's defaults: pairwise interaction (``distrec.towers.from_run``), coordinates
  in 4 dimensions, balance bound K of the data set;
- ``tp_paper``: the paper's: |mean cosine| interaction, n = 2 dimensions, R = 1 (equal
  towers; where T does not divide F, the tightest bound that exists, ceil(F/T) / floor(F/T));
- ``naive``: feature i in tower i % T;
- ``random``: a seeded random permutation of the strided assignment (same tower sizes);
- ``oracle``: planted data only: the planted groups themselves (what a perfect partitioner finds).

Data sets: the MovieLens and Criteo samples in ../shared/data, and ``planted``: synthetic
data whose clicks depend on factorisation-machine interactions inside 4 hidden groups of
3 features (``distrec.data.synthetic``). The p-values are two-sided Mann-Whitney U tests
(``scipy.stats.mannwhitneyu``) of the per-seed AUCs, as the paper tests its Table 6.

:func:`partitioner_study` returns the numbers (importable: ``benchmarks/dmt_quality.py``
uses it); run as a script it prints a table and, last, the harness's result record (one system
per data set and tower method, its AUC per seed) with the means and p-values per data set
(with ``--stability``: the interactions per epoch instead, no systems).

    python benchmarks/tower_partitioner.py                       # 3 data sets, 10 seeds
    python benchmarks/tower_partitioner.py --quick               # 2 seeds, 1 epoch
    python benchmarks/tower_partitioner.py --datasets planted --seeds 4
    python benchmarks/tower_partitioner.py --datasets planted --methods tp naive oracle --tower-c 0 --tower-interaction
    python benchmarks/tower_partitioner.py --datasets criteo --stability 8 --lr 0.003 --embedding-lr 0.03
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

import harness

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass(frozen=True)
class StudyData:
    """One data set of the study.

    Attributes:
        overrides: ``section.key=value`` config overrides selecting the data (on the tiny preset).
        towers: T, the number of towers.
        max_ratio: K, distrec's balance bound (largest tower <= K x smallest).
        epochs: training epochs of every model.
        lr, embedding_lr: Adam's learning rates of the dense parameters and of the tables.
    """

    overrides: tuple[str, ...]
    towers: int
    max_ratio: float
    epochs: int
    lr: float = 0.001
    embedding_lr: float = 0.01


DATASETS = {
    "movielens": StudyData(('data.format="movielens"', f'data.path="{SHARED / "movielens"}"'), 2, 2.0, 2),
    "criteo": StudyData(('data.format="criteo"', f'data.path="{SHARED / "criteo" / "criteo_kaggle_sample.tsv"}"'), 4, 1.5, 4),
    "planted": StudyData(
        (
            'data.format="synthetic"',
            "data.synthetic.rows=30000",
            "data.synthetic.num_sparse=12",
            "data.synthetic.num_dense=0",
            "data.synthetic.interaction_groups=4",
            "data.synthetic.table_rows=10",
            "data.max_ind_range=10",
            "model.top_mlp=[]",
        ),
        4,
        1.5,
        4,
        0.01,
        0.05,
    ),
}


@dataclass(frozen=True)
class Partitioner:
    """A tower partitioner setting: interaction measure ("pairwise" or "cosine"), coordinate
    dimensions, and balance bound: "dataset" (the data set's K) or "tightest" (the paper's
    R = 1: equal towers, or as near as T and F allow)."""

    interaction: str
    dims: int
    balance: Literal["dataset", "tightest"]


PARTITIONERS = {"tp": Partitioner("pairwise", 4, "dataset"), "tp_paper": Partitioner("cosine", 2, "tightest")}
METHODS = ("tp", "tp_paper", "naive", "random", "oracle")


@dataclass(frozen=True)
class StudyOptions:
    """Training settings shared by every model of the study."""

    dim: int = 16
    tower_dim: int = 8
    tower_c: int = 1
    tower_p: int = 1
    tower_interaction: bool = False  # the tower module's mix also reads the tower's pairwise dot products
    batch_size: int = 512
    sample_rows: int = 2048
    epochs: int | None = None  # None: each data set's own
    lr: float | None = None
    embedding_lr: float | None = None


def _log(message: str) -> None:
    print(f"tower_partitioner: {message}", file=sys.stderr, flush=True)


def random_towers(num_features: int, num_towers: int, seed: int) -> list[list[int]]:
    """Towers of the strided sizes with features drawn at random (seeded)."""
    from distrec.tower_partition import naive_assignment

    labels = np.random.default_rng(seed).permutation(naive_assignment(num_features, num_towers))
    return [[int(f) for f in np.flatnonzero(labels == t)] for t in range(num_towers)]


def _upper(matrix: torch.Tensor) -> np.ndarray:
    rows, cols = np.triu_indices(matrix.shape[0], k=1)
    return matrix.detach().cpu().numpy()[rows, cols]


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman correlation of the off-diagonal entries of two ``[F, F]`` interaction matrices
    (1: they rank the feature pairs alike; 0: unrelated)."""
    from scipy.stats import spearmanr

    return float(spearmanr(_upper(a), _upper(b)).statistic)


def interaction_agreement(matrices: Sequence[torch.Tensor]) -> float | None:
    """Mean :func:`rank_correlation` of the interaction matrices of different seeds."""
    pairs = [(a, b) for i, a in enumerate(matrices) for b in matrices[i + 1 :]]
    return float(np.mean([rank_correlation(a, b) for a, b in pairs])) if pairs else None


def load_study_data(name: str, options: StudyOptions) -> tuple[Any, Any, list[Any], dict[str, np.ndarray]]:
    """The run config, ``Dataset``, tables and ``{"train", "val"}`` row split (80/20, seed 0) of a data set."""
    from distrec import config
    from distrec.data import Dataset, prepare

    overrides = [f"model.embedding_dim={options.dim}", "model.bottom_mlp=[64]", "model.top_mlp=[64]", *DATASETS[name].overrides]
    cfg = config.load(None, overrides, preset="tiny")
    dataset = Dataset(prepare(cfg.data, progress=False), cfg.data)
    return cfg, dataset, dataset.tables(options.dim), dataset.split("random:0.2", seed=0)


def interaction_stability(name: str, seeds: int, epochs: int, options: StudyOptions, rows: int = 1024) -> list[dict]:
    """How the DLRM's pairwise interaction matrix settles as it trains (the partitioner's input).

    Per seed and epoch: held-out AUC and the Spearman correlation (:func:`rank_correlation`)
    of the matrix with the untrained model's; per seed, the correlation between the matrices
    of two disjoint ``rows``-row training samples after the last epoch (near 1: enough rows).
    """
    from distrec.models.build import build_model
    from distrec.towers.from_run import feature_interaction
    from distrec.train.evaluate import evaluate

    study = DATASETS[name]
    cfg, dataset, tables, split = load_study_data(name, options)
    lr, embedding_lr = options.lr or study.lr, options.embedding_lr or study.embedding_lr
    out = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        dlrm = build_model(cfg.model, dataset.num_dense, tables)
        shuffled = np.random.default_rng(seed).permutation(split["train"])
        sample, other = dataset.batch(np.sort(shuffled[:rows])), dataset.batch(np.sort(shuffled[-rows:]))
        untrained = feature_interaction(dlrm.eval(), sample, "pairwise", seed)
        per_epoch: list[dict] = []

        def after_epoch(epoch: int) -> None:
            interaction = feature_interaction(dlrm, sample, "pairwise", seed)
            auc = evaluate(dlrm, dataset, split["val"], 8192, torch.device("cpu"))["auc"]
            per_epoch.append({"epoch": epoch, "auc": round(auc, 4), "rho_untrained": round(rank_correlation(untrained, interaction), 3)})
            if epoch == epochs:
                per_epoch[-1]["rho_two_samples"] = round(rank_correlation(interaction, feature_interaction(dlrm, other, "pairwise", seed)), 3)

        harness.train_epochs(dlrm, dataset, split["train"], epochs, options.batch_size, seed, lr, embedding_lr, after_epoch=after_epoch)
        out.append({"seed": seed, "epochs": per_epoch, "rho_two_samples": per_epoch[-1]["rho_two_samples"]})
    return out


def run_dataset(name: str, seeds: int, options: StudyOptions, methods: Sequence[str] = METHODS, log: Callable[[str], None] = _log) -> dict:
    """AUC of DMT-DLRM per tower method and seed on one data set; see :func:`partitioner_study`."""
    from sklearn.metrics import adjusted_rand_score

    from distrec.data.synthetic import interaction_groups
    from distrec.models.build import build_model
    from distrec.towers.from_run import feature_interaction
    from distrec.towers.partition import partition_features, tightest_ratio
    from distrec.train.evaluate import evaluate

    study = DATASETS[name]
    cfg, dataset, tables, split = load_study_data(name, options)
    epochs, lr, embedding_lr = options.epochs or study.epochs, options.lr or study.lr, options.embedding_lr or study.embedding_lr
    names = [t.name for t in tables]
    dmt_model = dataclasses.replace(
        cfg.model,
        tower_module="dlrm",
        tower_dim=options.tower_dim,
        tower_c=options.tower_c,
        tower_p=options.tower_p,
        tower_interaction=options.tower_interaction,
    )
    planted = interaction_groups(cfg.data.synthetic) if cfg.data.format == "synthetic" else None
    methods = [m for m in methods if m != "oracle" or planted is not None]
    device = torch.device("cpu")
    auc: dict[str, list[float]] = {m: [] for m in ["dlrm", *methods]}
    interactions: dict[str, list[torch.Tensor]] = {p.interaction: [] for p in PARTITIONERS.values()}
    towers: dict[str, list[list[list[str]]]] = {m: [] for m in methods}
    left_from_init: list[float] = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        dlrm = build_model(cfg.model, dataset.num_dense, tables)
        sample = dataset.batch(np.sort(np.random.default_rng(seed).permutation(split["train"])[: options.sample_rows]))
        untrained = feature_interaction(dlrm.eval(), sample, "pairwise", seed)
        harness.train_epochs(dlrm, dataset, split["train"], epochs, options.batch_size, seed, lr, embedding_lr)
        auc["dlrm"].append(evaluate(dlrm, dataset, split["val"], 8192, device)["auc"])
        dlrm.eval()
        for measure, matrices in interactions.items():
            matrices.append(feature_interaction(dlrm, sample, measure, seed))
        left_from_init.append(rank_correlation(untrained, interactions["pairwise"][-1]))
        for method in methods:
            if method in PARTITIONERS:
                setting = PARTITIONERS[method]
                ratio = study.max_ratio if setting.balance == "dataset" else tightest_ratio(len(names), study.towers)
                part = partition_features(names, study.towers, "coherent", interactions[setting.interaction][-1], ratio, setting.dims, seed=seed)
                feature_towers = part.feature_indices(names)
            elif method == "oracle":
                feature_towers = [[int(f) for f in np.flatnonzero(planted == g)] for g in range(study.towers)]
            elif method == "naive":
                feature_towers = partition_features(names, study.towers, "naive").feature_indices(names)
            else:
                feature_towers = random_towers(len(names), study.towers, seed)
            towers[method].append([[names[f] for f in tower] for tower in feature_towers])
            torch.manual_seed(seed)
            dmt = build_model(dmt_model, dataset.num_dense, tables, towers=feature_towers)
            harness.train_epochs(dmt, dataset, split["train"], epochs, options.batch_size, seed, lr, embedding_lr)
            auc[method].append(evaluate(dmt, dataset, split["val"], 8192, device)["auc"])
        log(f"{name} seed {seed}: " + json.dumps({m: round(v[-1], 4) for m, v in auc.items()}))
    result = {
        "auc": auc,
        "epochs": epochs,
        "towers": study.towers,
        "interaction_agreement": {m: interaction_agreement(v) for m, v in interactions.items()},
        "pairwise_vs_untrained": float(np.mean(left_from_init)),
    }
    if planted is not None:
        group_of = {n: g for n, g in zip(names, planted)}
        result["ari_vs_planted"] = {
            m: float(np.mean([adjusted_rand_score([group_of[n] for t in part for n in t], [i for i, t in enumerate(part) for _ in t]) for part in parts]))
            for m, parts in towers.items()
        }
    result["towers_seed0"] = {m: parts[0] for m, parts in towers.items() if parts}
    return result


def summarise(result: dict) -> dict:
    """Mean and sd of the AUC per method, and the two-sided Mann-Whitney p-values of each
    partitioner setting vs naive and vs random (None without both methods)."""
    from scipy.stats import mannwhitneyu

    auc = result["auc"]

    def p_value(a: str, b: str) -> float | None:
        if a not in auc or b not in auc or len(auc[a]) < 2:
            return None
        return float(mannwhitneyu(auc[a], auc[b], alternative="two-sided").pvalue)

    summary = {
        "mean": {m: float(np.mean(v)) for m, v in auc.items()},
        "sd": {m: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for m, v in auc.items()},
        "p_value_vs_naive": p_value("tp", "naive"),
        "p_value_vs_random": p_value("tp", "random"),
        "paper_p_value_vs_naive": p_value("tp_paper", "naive"),
        "paper_p_value_vs_random": p_value("tp_paper", "random"),
    }
    return {**summary, **result}


def partitioner_study(
    datasets: Sequence[str] = tuple(DATASETS),
    seeds: int = 10,
    options: StudyOptions | None = None,
    methods: Sequence[str] = METHODS,
    log: Callable[[str], None] = _log,
) -> dict[str, dict]:
    """The partitioner study: per data set, DMT-DLRM's AUC per tower method over ``seeds`` seeds.

    Args:
        datasets: names in ``DATASETS`` ("movielens", "criteo", "planted").
        seeds: seeds 0..seeds-1 (at least 2 for a p-value; the paper's test wants ~10).
        options: model and training settings (default ``StudyOptions()``).
        methods: tower methods among ``METHODS``.
        log: receives one progress line per seed.

    Returns:
        per data set: ``mean`` / ``sd`` (AUC per method, and "dlrm", the DLRM without towers
        whose interactions the partitioner read), ``p_value_vs_naive`` / ``p_value_vs_random``
        (two-sided Mann-Whitney U, ``tp`` vs the baseline; ``paper_...`` the same for
        ``tp_paper``), ``auc`` (every seed's AUC), ``interaction_agreement`` (how alike the
        seeds' interaction matrices rank feature pairs), ``pairwise_vs_untrained`` (the same
        between the trained DLRM's pairwise matrix and its untrained initial state's: near 1,
        the partitioner sees the initialisation more than the data), ``towers_seed0``, ``epochs``,
        ``towers`` (T) and, on planted data, ``ari_vs_planted`` (adjusted Rand index of each
        method's towers against the planted groups, mean over seeds).

    Trains in this process with torch's current thread count (the script sets 1: on a
    loaded machine more threads wait on each other).
    """
    options = options or StudyOptions()
    return {name: summarise(run_dataset(name, seeds, options, methods, log)) for name in datasets}


def table_rows(results: dict[str, dict], methods: Sequence[str]) -> list[dict]:
    """One table row per data set: AUC mean ± sd per method, the p-values, the pairwise
    interaction's rank correlation between seeds (rho_seeds) and with the untrained model's
    (rho_untrained), and on planted data the ARI of tp / tp_paper / naive towers."""
    rows = []
    for name, r in results.items():
        row = {"data": name, "T": r["towers"], "epochs": r["epochs"], "seeds": len(r["auc"]["dlrm"])}
        for m in ["dlrm", *methods]:
            row[m] = f"{r['mean'][m]:.4f} ± {r['sd'][m]:.4f}" if m in r["mean"] else "-"
        for key in ("p_value_vs_naive", "p_value_vs_random", "paper_p_value_vs_naive"):
            row[key.replace("_value", "")] = "-" if r[key] is None else f"{r[key]:.3g}"
        row["rho_seeds"] = f"{r['interaction_agreement']['pairwise']:.2f}" if r["interaction_agreement"]["pairwise"] is not None else "-"
        row["rho_untrained"] = f"{r['pairwise_vs_untrained']:.2f}"
        if "ari_vs_planted" in r:
            row["ARI tp/paper/naive"] = "/".join(f"{r['ari_vs_planted'].get(m, float('nan')):.2f}" for m in ("tp", "tp_paper", "naive"))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> dict:
    from distrec.io import atomic_write_json
    from distrec.sim.report import format_table

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    harness.add_options(p, {f.name: f.default for f in dataclasses.fields(StudyOptions) if f.default is not None})
    p.add_argument("--epochs", type=int, default=None, help="epochs of every model (default: each data set's own)")
    p.add_argument("--lr", type=float, default=None, help="Adam's learning rate of the dense parameters (default: each data set's own)")
    p.add_argument("--embedding-lr", type=float, default=None, help="Adam's learning rate of the tables (default: each data set's own)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (on a loaded machine, more threads wait on each other)")
    p.add_argument("--quick", action="store_true", help="2 seeds, 1 epoch")
    p.add_argument("--out", default="runs/tower_partitioner")
    p.add_argument("--stability", type=int, default=0, metavar="EPOCHS", help="instead: how the DLRM's interactions settle over EPOCHS (2 seeds)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.seeds, args.epochs = min(args.seeds, 2), 1
    options = StudyOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(StudyOptions)})
    if args.stability:
        stability = {name: interaction_stability(name, 2, args.stability, options) for name in args.datasets}
        return harness.finish(harness.ResultRecord("tower_partitioner", [], None, stability))
    results = partitioner_study(args.datasets, args.seeds, options, args.methods)
    print(format_table(table_rows(results, args.methods)))
    compact = {
        name: {
            "auc_mean": {m: round(v, 4) for m, v in r["mean"].items()},
            "p_value_vs_naive": r["p_value_vs_naive"],
            "p_value_vs_random": r["p_value_vs_random"],
            "paper_p_value_vs_naive": r["paper_p_value_vs_naive"],
        }
        for name, r in results.items()
    }
    atomic_write_json(Path(args.out) / "tower_partitioner.json", {"seeds": args.seeds, "options": dataclasses.asdict(options), "results": results})
    systems = [
        harness.SystemResult(f"{name}, {method}", "validation AUC", "AUC", harness.Samples(aucs))
        for name, r in results.items()
        for method, aucs in r["auc"].items()
    ]
    return harness.finish(harness.ResultRecord("tower_partitioner", systems, None, compact))


if __name__ == "__main__":
    main()
