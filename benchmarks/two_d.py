"""2D sparse parallelism on an emulated 2-host cluster, against full sharding and the simulator;
and what periodic replica sync costs in AUC on the real samples.

(a) ``cluster``: 4 ranks (2 hosts x 2, ``emulated_cluster.py``: namespaces, tc-shaped links,
default 1 Gbit/s and 0.2 ms host to host), replica groups = hosts. Configurations, each
trained by distrec's trainer on the same synthetic data and global batch (DLRM 13-64-D, dot,
128-64-1; Adam for the dense layers, row-wise Adagrad for the tables, every table whole on
one rank of its group):

- ``full``: full sharding over the 4 ranks (``--replica-groups 1``);
- ``exact``: 2 groups x 2 ranks, row gradients averaged across groups every step;
- ``periodic_k{K}``: 2 x 2, replicas (weights and row-wise state) averaged every K steps.

They run in interleaved rounds (every round trains each configuration once, the order
rotating), so the machine's load falls alike on all. Per configuration: samples/s (the global
batch over the mean step time, data loading included) as a ratio to ``full`` of the same
round (median over rounds), the mean iteration time (the slowest rank per step, data loading
and warm-up steps left out, median over rounds), per step and
component (all-to-all, replica sync, dense all-reduce) the bytes and time from the trainer's
breakdown, and the bytes that crossed the host links (veth counters over the training steps;
the final evaluation's and checkpoint's traffic measured again and taken out; divided by the ranks). Next to each,
what ``distrec.sim`` predicts (``predict`` / ``predict_two_d``) for the same model, batch and
tables on the same links: links fitted to all-to-alls timed on the cluster and the wait of
a collective for its last member (``emulated_cluster.measure_links``), gloo's ring all-reduce, the synthetic data's Zipf exponent (the rows exact sync moves), and as compute one
process's training step of the same model at the local batch with every table local (dense
layers, lookups, optimizers: ``local_step_ms``, timed on every rank before the runs, the
slowest), and as the touched-row merge's cost per row that of a merge timed alone on every
rank (``row_merge_seconds``), so that the comparison tests the simulator's communication and its sum.

The breakdown counts a rank's whole send buffer (its own share too) and the embedding
exchange forward only; the simulator counts bytes sent to other ranks, forward and backward,
and a ring all-reduce's 2 (n - 1) / n of the gradient bytes. ``measured_as_simulated``
converts the first to the second (x (S - 1) / S, backward = forward, the ring factor) so that
the two compare; the link counters are the direct measurement of cross-host bytes.

(b) ``auc``: on the real samples (Criteo and MovieLens, ``configs/*.yaml``, read from
../shared/data), ``distrec train --nproc-per-node 4 --replica-groups 2`` with exact and
periodic K sync, the held-out AUC, mean over seeds (AUC does not depend on the load).

Run as root (namespaces and tc need it):
    python benchmarks/two_d.py                             # both parts, 3 rounds, 3 seeds
    python benchmarks/two_d.py --parts cluster --rounds 5
    python benchmarks/two_d.py --no-netns --quick          # CI-safe: plain processes, loopback, tiny
The last line printed is the harness's result record (every configuration's samples/s per
round; on part (b) alone, every variant's AUC per seed) with every figure (``speedup_exact``,
``speedup_periodic_k10``, ``predicted_vs_measured_ms`` per configuration,
``auc_delta_periodic_k10``, ``auc_delta_periodic_k50``); the same is written to
OUT/two_d.json. Each run's folder (config, metrics, breakdown, checkpoint) is under OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

import harness
from emulated_cluster import ALL_REDUCE, finish_rank, fitted_cluster, max_over_ranks, run_ranks, start_rank, started_as_rank, train_measured

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
SAMPLES = {  # name: (config file, data path), as benchmarks/quality.py trains them
    "criteo": (ROOT / "configs" / "criteo-sample.yaml", SHARED / "criteo" / "criteo_kaggle_sample.tsv"),
    "movielens": (ROOT / "configs" / "movielens.yaml", SHARED / "movielens"),
}
COMPONENTS = {  # simulator component: the breakdown's components (ms and bytes)
    "all_to_all": ("input_all_to_all", "output_all_to_all"),
    "replica_sync": ("replica_sync",),
    "all_reduce": ("gradient_all_reduce",),
}
GROUPS = 2  # replica groups of the 2D configurations (= hosts)


# ----------------------------------------------------------------------------- (a) the cluster


def configurations(args: argparse.Namespace) -> dict[str, dict]:
    """name: (replica groups, sync, K) of every configuration of (a)."""
    return {
        "full": {"groups": 1, "sync": "exact", "every": 1},
        "exact": {"groups": GROUPS, "sync": "exact", "every": 1},
        **{f"periodic_k{k}": {"groups": GROUPS, "sync": "periodic", "every": k} for k in args.sync_every},
    }


def overrides(args: argparse.Namespace, out: Path, config: dict) -> list[str]:
    """The ``--set`` items of one configuration's run."""
    rows = args.steps * args.global_batch + args.eval_rows
    return [
        "data.format=synthetic", f"data.synthetic.rows={rows}", "data.synthetic.num_dense=13",
        f"data.synthetic.num_sparse={args.features}", f"data.synthetic.table_rows={args.table_rows}", "data.synthetic.seed=1234",
        f"data.max_ind_range={args.table_rows}", f"data.split=last:{args.eval_rows / rows!r}", f"data.cache_dir={out / 'cache'}",
        f"model.embedding_dim={args.dim}", "model.interaction=dot", "model.bottom_mlp=[64]", "model.top_mlp=[128,64]",
        f"train.batch_size={args.global_batch}", f"train.max_steps={args.steps}", f"train.eval_batch_size={args.eval_rows}",
        "train.optimizer=adam", f"train.lr={args.lr}", "train.embedding_optimizer=adagrad", f"train.embedding_lr={args.embedding_lr}",
        "train.threads=1", "train.log_every=0", f"parallel.hosts={args.hosts}", f"parallel.ranks_per_host={args.ranks_per_host}",
        "parallel.sharding=table_wise", f"parallel.replica_groups={config['groups']}", f"parallel.replica_sync={config['sync']}",
        *([f"parallel.sync_every={config['every']}"] if config["sync"] == "periodic" else []),
    ]  # fmt: skip


def launch(args: argparse.Namespace, out: Path) -> dict:
    """Train every configuration in rounds on the cluster; the ranks' raw figures."""
    from distrec.io import atomic_write_json

    result_file = out / "two_d.rank0.json"  # the ranks' raw figures
    result_file.unlink(missing_ok=True)
    runs = {name: overrides(args, out, c) for name, c in configurations(args).items()}
    size = args.hosts * args.ranks_per_host // GROUPS  # ranks per group
    merge = {"shard_rows": args.features // size * args.table_rows, "lookups": args.global_batch // GROUPS * args.features // size, "dim": args.dim}
    spec = {"runs": runs, "out": str(out), "warmup": args.warmup, "rounds": args.rounds, "hosts": args.hosts,
            "ranks_per_host": args.ranks_per_host, "result_file": str(result_file), "merge": merge}  # fmt: skip
    spec_file = out / "two_d.spec.json"
    atomic_write_json(spec_file, spec)
    worker = [sys.executable, os.path.abspath(__file__), harness.WORKER_FLAG, str(spec_file)]
    args.latency_emulated = run_ranks(worker, args.hosts, args.ranks_per_host, args.bandwidth, args.latency_ms, args.no_netns, "two_d")
    return json.loads(result_file.read_text())


def worker(spec_file: str) -> None:
    """One rank: time the links, then train every configuration in rounds; rank 0 writes the figures."""

    from distrec import config

    spec, rank, topology, calibration = start_rank(spec_file)
    names = list(spec["runs"])
    calibration["local_step_ms"] = max_over_ranks(local_step_ms(config.load(None, spec["runs"][names[0]]), topology.world_size))
    calibration["row_merge_s"] = max_over_ranks(row_merge_seconds(**spec["merge"]))

    def configuration(name: str):
        def run(r: int) -> dict:
            result = train_run(config.load(None, spec["runs"][name]), Path(spec["out"]) / name / f"round{r}", spec["warmup"])
            if rank == 0:
                print(f"two_d: round {r} {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
            return result

        return run

    results = harness.interleaved_rounds({name: configuration(name) for name in names}, spec["rounds"], order="rotate")
    finish_rank(spec, rank, {"runs": results, "calibration": calibration})


def local_step_ms(cfg, world_size: int, steps: int = 12) -> float:
    """Median ms of one process's training step of ``cfg``'s model at the local batch, every table
    local (dense layers, lookups, optimizers): the simulator's compute on this machine."""
    import time

    from distrec.components.optim import make_optimizers
    from distrec.components.step import TrainStep
    from distrec.data import Dataset, prepare
    from distrec.models.build import build_model

    dataset = Dataset(prepare(cfg.data, progress=False), cfg.data)
    model = build_model(cfg.model, dataset.num_dense, dataset.tables(cfg.model.embedding_dim))
    t = cfg.train
    step = TrainStep(model, make_optimizers(model, t.optimizer, t.lr, t.embedding_optimizer, t.embedding_lr))
    b = t.batch_size // world_size
    times = []
    for i in range(steps):
        batch = dataset.batch(np.arange(i * b, (i + 1) * b))
        started = time.perf_counter()
        step(batch)
        times.append((time.perf_counter() - started) * 1e3)
    return float(np.median(times[2:]))


def row_merge_seconds(shard_rows: int, lookups: int, dim: int, steps: int = 10) -> float:
    """Seconds per touched row that a periodic sync's touched-row log (``steps`` steps of
    ``lookups`` uniform lookups into a [shard_rows, dim] shard) and merge take on this rank,
    alone in its group (a collective: every rank makes the one-rank groups); the simulator's
    ``Cluster.row_merge_s`` on this machine."""
    import time

    import torch
    import torch.distributed as dist

    from distrec.parallel.two_d import TouchLog, merge_touched_rows

    alone = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
    weights, state, draws = torch.randn(shard_rows, dim), torch.rand(shard_rows), torch.Generator().manual_seed(dist.get_rank())
    costs = []
    for _ in range(3):
        log = TouchLog()
        started = time.perf_counter()
        for _ in range(steps):
            log.steps += 1
            log.record(weights, torch.randint(0, shard_rows, (lookups,), generator=draws).unique())
        touched = log.take(weights)
        merge_touched_rows(weights, [state], touched, steps, alone)
        costs.append((time.perf_counter() - started) / touched[1].numel())
    return float(np.median(costs))


def train_run(cfg, out: Path, warmup: int) -> dict:
    """Train one run: mean step times (slowest rank per step), bytes per step, link bytes."""
    from distrec.components.breakdown import COMPONENTS as BREAKDOWN

    parts = {"iteration": [c for c in BREAKDOWN if c != "data_loading"], **{c: (c,) for c in BREAKDOWN}}
    summary, slowest, link_bytes = train_measured(cfg, out, warmup, parts)
    figures = {f"{name}_ms": float(np.mean(ms)) for name, ms in slowest.items()}
    # global samples per second of the measured steps, data loading included
    figures["samples_per_s"] = cfg.train.batch_size * 1e3 / (figures["iteration_ms"] + figures["data_loading_ms"])
    if summary is not None:
        breakdown = json.loads((out / "breakdown.json").read_text())
        figures.update(auc=summary["auc"], bytes_per_step=breakdown["bytes_per_step"], replica_average=summary.get("replica_average", "all"))
    figures["link_bytes_per_step"] = link_bytes
    return figures


# ----------------------------------------------------------------------------- (a) the simulator


def workload(args: argparse.Namespace, out: Path):
    """The simulator's ``Workload`` of the configurations (model from its config, one process)."""
    import torch

    from distrec import config
    from distrec.data import Dataset, prepare
    from distrec.models.build import build_model
    from distrec.models.tower_modules import mflops_per_sample
    from distrec.sim.workload import Workload

    cfg = config.load(None, overrides(args, out, configurations(args)["full"]))
    dataset = Dataset(prepare(cfg.data, progress=False), cfg.data)
    tables = dataset.tables(args.dim)
    model = build_model(cfg.model, dataset.num_dense, tables)
    batch = dataset.batch(np.arange(256))
    with torch.no_grad():
        model.eval()
        mflops = mflops_per_sample(model, batch)  # matrix products only: the dense layers and the interaction
    return Workload(
        local_batch=args.global_batch // (args.hosts * args.ranks_per_host),
        num_features=len(tables),
        embedding_dim=args.dim,
        pooling=float(batch.lengths().float().mean()),
        dense_mflops=mflops,
        dense_params=sum(p.numel() for p in model.dense_parameters()),
        table_rows=tuple(t.num_rows for t in tables),
        row_state_floats=1,  # row-wise Adagrad
        zipf_exponent=cfg.data.synthetic.zipf_exponent,  # how the synthetic data draws rows
    )


def measured_as_simulated(bytes_per_step: dict, ranks: int, group_size: int) -> dict[str, float]:
    """The breakdown's bytes per step in the simulator's convention (see the module's docstring)."""
    others = (group_size - 1) / group_size
    return {
        "all_to_all": (bytes_per_step["input_all_to_all"] + 2 * bytes_per_step["output_all_to_all"]) * others,
        "replica_sync": bytes_per_step["replica_sync"],  # G = 2: an all-gather or ring all-reduce sends the payload once
        "all_reduce": bytes_per_step["gradient_all_reduce"] * 2 * (ranks - 1) / ranks,
    }


def compare(raw: dict, args: argparse.Namespace, out: Path) -> dict:
    """Per configuration: measured figures (medians over rounds), the simulator's, and their ratios."""
    from distrec.sim.collectives import all_reduce
    from distrec.sim.components import compute_ms
    from distrec.sim.iteration import predict, predict_two_d

    cluster, links = fitted_cluster(raw["calibration"], args.hosts, args.ranks_per_host, all_reduce_algorithm="ring")
    work = workload(args, out)
    if cluster is not None:  # compute at the rate of the measured local step, not of a large matrix product
        calibrated = raw["calibration"]
        cluster = cluster.replace(
            compute_efficiency=compute_ms(work, cluster, towers=False) / calibrated["local_step_ms"], row_merge_s=calibrated["row_merge_s"]
        )
    ranks = args.hosts * args.ranks_per_host
    runs = raw["runs"]
    table = {}
    for name, c in configurations(args).items():
        rounds = runs[name]
        med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
        bytes_per_step = {k: statistics.median(r["bytes_per_step"][k] for r in rounds) for k in rounds[0]["bytes_per_step"]}
        measured = {
            "samples_per_s": med("samples_per_s"),
            "samples_per_s_per_round": [r["samples_per_s"] for r in rounds],
            "speedup": statistics.median(r["samples_per_s"] / f["samples_per_s"] for r, f in zip(rounds, runs["full"])),
            "iteration_ms": med("iteration_ms"),
            "ms": {k: sum(med(f"{p}_ms") for p in parts) for k, parts in COMPONENTS.items()},
            "breakdown_bytes": bytes_per_step,
            "bytes": measured_as_simulated(bytes_per_step, ranks, ranks // c["groups"]),
            # the hosts' links carry every rank's cross-host bytes: per rank, as the simulator counts
            "link_bytes": med("link_bytes_per_step") / ranks if rounds[0]["link_bytes_per_step"] is not None else None,
            "auc": med("auc"),
        }
        entry = {"measured": measured}
        if cluster is not None:
            average = rounds[0]["replica_average"]  # how the run's periodic sync averaged rows (auto: by its optimizer)
            p = predict(work, cluster, "flat") if c["groups"] == 1 else predict_two_d(work, cluster, c["groups"], c["sync"], c["every"], average=average)
            predicted = {"total_ms": p.total_ms, "compute_ms": p.compute_ms, **{k: getattr(p, k).as_dict() for k in COMPONENTS}}
            predicted["cross_host_bytes"] = sum(predicted[k]["cross_host_bytes"] for k in COMPONENTS)
            entry["predicted"] = predicted
            entry["predicted_over_measured"] = {
                "iteration_ms": p.total_ms / measured["iteration_ms"],
                **{f"{k}_bytes": predicted[k]["bytes"] / measured["bytes"][k] if measured["bytes"][k] else None for k in COMPONENTS},
                "cross_host_bytes": predicted["cross_host_bytes"] / measured["link_bytes"] if measured["link_bytes"] else None,
            }
        table[name] = entry
    # the simulator's ring against all-reduces timed on the cluster (sizes the links were not fitted to)
    ring_check = [
        {"bytes": s["bytes"], "measured_ms": s["ms"], "predicted_ms": all_reduce(cluster, s["bytes"], args.hosts, args.ranks_per_host).ms}
        for s in raw["calibration"].get(ALL_REDUCE, []) if cluster is not None
    ]  # fmt: skip
    return {
        "configurations": table,
        "links": links,
        "all_reduce_check": ring_check,
        "calibration": raw["calibration"],
        "workload": work.__dict__ if cluster else None,
    }


# ----------------------------------------------------------------------------- (b) AUC on the real samples


def auc_runs(args: argparse.Namespace, out: Path) -> dict:
    """Held-out AUC of exact and periodic 2D sync on each sample, per seed and mean."""
    variants = {"exact": ["--replica-sync", "exact"], **{f"periodic_k{k}": ["--replica-sync", "periodic", "--sync-every", str(k)] for k in args.sync_every}}
    result = {}
    for sample in args.samples:
        config_file, path = SAMPLES[sample]
        aucs: dict[str, list[float]] = {v: [] for v in variants}
        for seed in args.seeds:
            for variant, flags in variants.items():
                run = harness.distrec_train(
                    out / "auc" / sample / f"{variant}-seed{seed}",
                    [
                        "--config",
                        str(config_file),
                        "--replica-groups",
                        str(GROUPS),
                        *flags,
                        *harness.set_items([f'data.path="{path}"', f"train.seed={seed}", "train.threads=1"]),
                    ],  # fmt: skip
                    procs=args.auc_procs,
                )
                aucs[variant].append(run.summary["auc"])
                print(f"two_d: {sample} seed {seed} {variant}: AUC {run.summary['auc']:.4f}", file=sys.stderr, flush=True)
        means = {v: statistics.fmean(a) for v, a in aucs.items()}
        result[sample] = {"auc": aucs, "auc_mean": means, "delta_vs_exact": {v: means[v] - means["exact"] for v in variants if v != "exact"}}
    return result


# ----------------------------------------------------------------------------- report


def summarize(args: argparse.Namespace, cluster: dict | None, auc: dict | None) -> dict:
    summary: dict = {"args": {k: v for k, v in vars(args).items() if k != "parts"}, "load_average": os.getloadavg()}
    if cluster is not None:
        summary["cluster"] = cluster
        table = cluster["configurations"]
        summary["speedup_exact"] = table["exact"]["measured"]["speedup"]
        summary["speedup_periodic_k10"] = table["periodic_k10"]["measured"]["speedup"] if "periodic_k10" in table else None
        summary["predicted_vs_measured_ms"] = {
            name: [e["predicted"]["total_ms"], e["measured"]["iteration_ms"]] if "predicted" in e else None for name, e in table.items()
        }
    if auc is not None:
        summary["auc"] = auc
        for k in args.sync_every:
            deltas = [auc[s]["delta_vs_exact"][f"periodic_k{k}"] for s in auc]
            summary[f"auc_delta_periodic_k{k}"] = {s: auc[s]["delta_vs_exact"][f"periodic_k{k}"] for s in auc} | {"worst": min(deltas)}
    return summary


def print_table(cluster: dict) -> None:
    from distrec.sim.report import format_table

    rows = []
    for name, e in cluster["configurations"].items():
        m, p = e["measured"], e.get("predicted")
        row = {"config": name, "speedup": m["speedup"], "iter_ms": m["iteration_ms"], "sim_ms": p["total_ms"] if p else "-"}
        for k in COMPONENTS:
            row[f"{k}_kB"] = m["bytes"][k] / 1e3
            row[f"sim_{k}_kB"] = p[k]["bytes"] / 1e3 if p else "-"
        row["link_kB"] = m["link_bytes"] / 1e3 if m["link_bytes"] is not None else "-"
        row["sim_cross_kB"] = p["cross_host_bytes"] / 1e3 if p else "-"
        rows.append(row)
    print(format_table(rows, digits=3))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = dict(hosts=2, ranks_per_host=2, bandwidth="1gbit", latency_ms=0.2, global_batch=2048, features=16, dim=64, table_rows=20000,
                    steps=150, warmup=50, eval_rows=1024, lr=0.003, embedding_lr=0.05, rounds=3, sync_every=[10, 50], seeds=[0, 1, 2],
                    samples=["criteo", "movielens"], auc_procs=4)  # fmt: skip
    # 150 steps, 50 of warm-up: the run (bytes, link counters) and its 100 timed steps both hold whole periods of K = 10 and 50
    harness.add_options(p, defaults, {
        "bandwidth": "tc rate of every host link (default 1gbit)",
        "latency_ms": "host-to-host delay (ms, default 0.2)",
        "sync_every": "K of the periodic configurations (default 10 50)",
        "auc_procs": "processes of the AUC runs (2 replica groups of half of them)",
    })  # fmt: skip
    p.add_argument("--parts", nargs="+", choices=["cluster", "auc"], default=["cluster", "auc"], help="which parts to run (default both)")
    p.add_argument("--no-netns", action="store_true", help="plain processes on the loopback (CI-safe)")
    p.add_argument("--quick", action="store_true", help="a short run: fewer steps and rounds, smaller batch and model, one seed")
    p.add_argument("--out", default="runs/two_d", help="folder of the JSON results and the runs")
    p.add_argument("--report-only", action="store_true", help="report again from the figures a run left in OUT (same options), running nothing")
    if "--quick" in (sys.argv[1:] if argv is None else argv):  # smaller defaults; options given still count
        p.set_defaults(steps=12, warmup=2, global_batch=256, eval_rows=256, dim=8, table_rows=500, rounds=1, seeds=[0])
    args = p.parse_args(argv)
    world = args.hosts * args.ranks_per_host
    if args.hosts != GROUPS or args.global_batch % world or args.eval_rows % world or args.steps <= args.warmup:
        p.error(f"--hosts must be {GROUPS} (groups = hosts); --global-batch and --eval-rows multiples of the ranks; --steps > --warmup")
    if args.auc_procs % GROUPS:
        p.error(f"--auc-procs must be a multiple of {GROUPS}")
    return args


def main(argv: list[str] | None = None) -> dict:
    from distrec.io import atomic_write_json

    if started_as_rank(argv, worker):
        return {}
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if "cluster" in args.parts:
        raw = json.loads((out / "two_d.rank0.json").read_text()) if args.report_only else launch(args, out)
        cluster = compare(raw, args, out)
    else:
        cluster = None
    if cluster is not None:
        print_table(cluster)
    auc_file = out / "two_d.auc.json"  # part (b)'s figures
    if "auc" in args.parts and not args.report_only:
        atomic_write_json(auc_file, auc_runs(args, out))
    auc = json.loads(auc_file.read_text()) if "auc" in args.parts else None
    summary = summarize(args, cluster, auc)
    if cluster is not None:
        systems = [
            harness.SystemResult(name, "throughput", "samples/s", harness.Samples(e["measured"]["samples_per_s_per_round"]))
            for name, e in cluster["configurations"].items()
        ]
    else:
        systems = [
            harness.SystemResult(f"{sample}, {variant}", "held-out AUC", "AUC", harness.Samples(a))
            for sample, r in (auc or {}).items()
            for variant, a in r["auc"].items()
        ]
    return harness.finish(harness.ResultRecord("two_d", systems, summary.get("speedup_exact"), summary), out / "two_d.json")


if __name__ == "__main__":
    main()
