"""DMT on an emulated multi-host cluster: flat all-to-all vs SPTT vs SPTT + tower modules.

Each host is a Linux network namespace; its ranks talk over its loopback, and hosts are
joined by veth links to a bridge in the root namespace, every link shaped with ``tc`` (tbf
rate + netem delay, default 1 Gbit/s and 0.2 ms host to host), so cross-host traffic is
really slower than intra-host traffic (``emulated_cluster.py``, shared with ``two_d.py``).

Every scheme is trained by distrec's own trainer (``distrec.train.loop.Trainer``), each rank
started inside its host's namespace with torchrun's environment variables, on the same
synthetic data (towers = the planted interaction groups, one tower per host) and global
batch; the model is distrec's DLRM (bottom MLP 13-64-N, dot interaction, top MLP 128-64-1;
DMT-DLRM with the tower modules), Adam for the dense layers and lazy Adam for the tables:

- ``flat``: the ``sharded`` mode with the tables placed as SPTT places them (tower t's
  tables on host t), one all-to-all over all ranks;
- ``sptt``: ``--lookup sptt``, the six SPTT steps (same maths as flat);
- ``dmt_cr{K}``: ``--lookup sptt --tower-module dlrm``, a DLRM tower module per host
  compressing K x (K in --compressions).

Per scheme it prints the median iteration time (the trainer's time breakdown without data
loading, the slowest rank per step, warm-up steps left out), the median embedding forward
time (input exchange, lookup, output exchange / SPTT with the tower module) and of its
output exchange alone, cross-host bytes per iteration (veth counters over the training
steps, the final evaluation's traffic subtracted; with --no-netns only the payload computed
from the exchange sizes) and the held-out AUC. Ratios are against ``flat`` of the same run:
``speedup_sptt``, and ``speedup_dmt`` for the best compression whose AUC is within 0.005 of
flat's. It also fits the simulator's links to all-to-all timings measured on the same
cluster (distrec.sim.calibrate) and reports predicted / measured forward output-exchange
times (the flat all-to-all, or SPTT steps (c)-(f) with the tower module).

Run as root (namespaces and tc need it):
    python benchmarks/dmt_cluster.py                      # 2 hosts x 2 ranks, 1 Gbit/s, 0.2 ms
    python benchmarks/dmt_cluster.py --quick              # fewer steps, smaller model
    python benchmarks/dmt_cluster.py --bandwidth 200mbit --latency-ms 1 --out runs/dmt_cluster
    python benchmarks/dmt_cluster.py --no-netns --hosts 1 --quick   # CI-safe: plain processes, loopback
The last line printed is the harness's result record (every scheme's iteration time per
step, ``ratio`` = ``speedup_dmt``) with every figure; the same is written to
OUT/dmt_cluster.json with a PNG of the times (OUT/dmt_cluster.png). Each scheme's run
folder (config, metrics, breakdown, checkpoint) is OUT/<scheme>.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

import harness
from emulated_cluster import finish_rank, fitted_cluster, run_ranks, start_rank, started_as_rank, train_measured

AUC_TOLERANCE = 0.005  # the most AUC a DMT scheme may lose against flat to count as a speedup
EMBEDDING_FORWARD = ("input_all_to_all", "lookup", "output_all_to_all")  # the trainer's breakdown components


# ----------------------------------------------------------------------------- launcher


def scheme_overrides(args: argparse.Namespace, out: Path) -> dict[str, list[str]]:
    """The ``--set`` items of every scheme's run; writes the towers and the flat plan into ``out``."""
    from distrec import config
    from distrec.data import Dataset, prepare
    from distrec.data.synthetic import SyntheticGenerator
    from distrec.parallel.sptt import FeatureLayout
    from distrec.parallel.sptt_embedding import tower_plan
    from distrec.parallel.topology import Topology
    from distrec.tower_partition import TowerPartition

    rows = args.steps * args.global_batch + args.eval_rows
    common = [
        "data.format=synthetic", f"data.synthetic.rows={rows}", "data.synthetic.num_dense=13",
        f"data.synthetic.num_sparse={args.features}", f"data.synthetic.table_rows={args.table_rows}",
        f"data.synthetic.interaction_groups={args.hosts if args.hosts > 1 else 0}", "data.synthetic.seed=1234",
        f"data.max_ind_range={args.table_rows}", f"data.split=last:{args.eval_rows / rows!r}", f"data.cache_dir={out / 'cache'}",
        f"model.embedding_dim={args.dim}", "model.interaction=dot", "model.bottom_mlp=[64]", "model.top_mlp=[128,64]",
        f"train.batch_size={args.global_batch}", f"train.max_steps={args.steps}", f"train.eval_batch_size={args.eval_rows}",
        "train.optimizer=adam", f"train.lr={args.lr}", "train.embedding_optimizer=adam", f"train.embedding_lr={args.embedding_lr}",
        "train.threads=1", "train.log_every=0", f"parallel.hosts={args.hosts}", f"parallel.ranks_per_host={args.ranks_per_host}",
    ]  # fmt: skip
    cfg = config.load(None, common)
    tables = Dataset(prepare(cfg.data, progress=False), cfg.data).tables(args.dim)  # parsed once, before the ranks start
    names = [t.name for t in tables]
    groups = SyntheticGenerator(cfg.data.synthetic).groups
    towers = [[names[f] for f in np.flatnonzero(groups == h)] for h in range(args.hosts)] if args.hosts > 1 else [names]
    TowerPartition(towers, "coherent").save(out / "towers.json")  # the planted groups
    layout = FeatureLayout.from_towers(Topology(args.hosts, args.ranks_per_host), TowerPartition(towers, "coherent").feature_indices(names))
    tower_plan(tables, layout).save(out / "flat-plan.json")
    sptt = [*common, "parallel.lookup=sptt", f"parallel.towers={out / 'towers.json'}"]
    return {
        "flat": [*common, f"parallel.plan={out / 'flat-plan.json'}"],
        "sptt": sptt,
        **{f"dmt_cr{k:g}": [*sptt, "model.tower_module=dlrm", f"model.tower_compression={k}"] for k in args.compressions},
    }


def model_figures(overrides: list[str], hosts: int, ranks_per_host: int, batch: int) -> dict:
    """What a scheme's model is, from its config (one process, stand-in tables): dense and tower
    parameters, the tower modules' MFLOPs per sample, the compression, and the bytes the
    embedding payload sends between hosts per iteration, forward and backward."""
    import torch

    from distrec import config
    from distrec.data import Dataset, prepare
    from distrec.models.build import build_model
    from distrec.models.dmt_cost import dmt_cost
    from distrec.models.tower_modules import mflops_per_sample, num_parameters
    from distrec.tables import stand_in_tables
    from distrec.tower_partition import resolve_towers

    cfg = config.load(None, overrides)
    dataset = Dataset(prepare(cfg.data, progress=False), cfg.data)
    tables = dataset.tables(cfg.model.embedding_dim)
    towers = resolve_towers([t.name for t in tables], cfg.parallel.towers, hosts)
    tower_modules = cfg.model.tower_module is not None
    model = build_model(cfg.model, dataset.num_dense, stand_in_tables(tables), towers=towers if tower_modules else None)
    out_floats = sum(model.embeddings.tower_dims) if tower_modules else len(tables) * cfg.model.embedding_dim  # per sample, leaving the towers
    figures = {
        "dense_params": sum(p.numel() for p in model.dense_parameters()),
        # forward and backward embedding payload between hosts: L(H-1) peers' b samples each way
        "cross_host_payload_bytes": 2 * ranks_per_host * (hosts - 1) * batch * out_floats * 4,
    }
    if tower_modules:
        modules = model.embeddings.tower_modules()
        figures.update(
            compression=dmt_cost(cfg.model, dataset.num_dense, tables, towers)["compression"],
            tower_dim=model.embeddings.spec.dim,
            tower_params=sum(num_parameters(m) for m in modules.values()),
            tower_mflops_per_sample=sum(mflops_per_sample(m, torch.zeros(8, len(towers[t]), cfg.model.embedding_dim)) for t, m in modules.items()),
        )
    return figures


def launch(args: argparse.Namespace) -> dict:
    """Train every scheme on hosts x ranks_per_host ranks (in namespaces unless --no-netns); the figures."""
    from distrec.io import atomic_write_json

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    result_file = out / "dmt_cluster.rank0.json"
    result_file.unlink(missing_ok=True)
    schemes = scheme_overrides(args, out)
    spec = {"schemes": schemes, "out": str(out), "warmup": args.warmup, "hosts": args.hosts, "ranks_per_host": args.ranks_per_host,
            "result_file": str(result_file)}  # fmt: skip
    spec_file = out / "dmt_cluster.spec.json"
    atomic_write_json(spec_file, spec)
    worker = [sys.executable, os.path.abspath(__file__), harness.WORKER_FLAG, str(spec_file)]
    args.latency_emulated = run_ranks(worker, args.hosts, args.ranks_per_host, args.bandwidth, args.latency_ms, args.no_netns, "dmt_cluster")
    raw = json.loads(result_file.read_text())
    b = args.global_batch // (args.hosts * args.ranks_per_host)
    for name, overrides in schemes.items():
        raw["schemes"][name].update(model_figures(overrides, args.hosts, args.ranks_per_host, b))
    return raw


# ----------------------------------------------------------------------------- worker


def worker(spec_file: str) -> None:
    """One rank: time the links, then train every scheme with distrec's trainer; rank 0 writes the figures."""

    from distrec import config

    spec, rank, _, calibration = start_rank(spec_file)
    results = {}
    for scheme, overrides in spec["schemes"].items():
        results[scheme] = train_scheme(config.load(None, overrides), Path(spec["out"]) / scheme, spec["warmup"])
        if rank == 0:
            print(f"dmt_cluster: {scheme}: {json.dumps(results[scheme])}", file=sys.stderr, flush=True)
    finish_rank(spec, rank, {"schemes": results, "calibration": calibration})


def train_scheme(cfg, out: Path, warmup: int) -> dict:
    """Train one scheme with ``Trainer``; its median step times, cross-host bytes and AUC (rank 0)."""
    from distrec.components.breakdown import COMPONENTS

    parts = {"iteration": [c for c in COMPONENTS if c != "data_loading"], "embedding_forward": EMBEDDING_FORWARD, "output_exchange": ("output_all_to_all",)}
    summary, slowest, cross_host = train_measured(cfg, out, warmup, parts)
    return {
        "iteration_ms": float(np.median(slowest["iteration"])),
        "iteration_ms_per_step": [float(ms) for ms in slowest["iteration"]],
        "embedding_forward_ms": float(np.median(slowest["embedding_forward"])),
        # forward output exchange alone: flat all-to-all, or SPTT steps (c)-(f) with the tower module
        "output_exchange_ms": float(np.median(slowest["output_exchange"])),
        "auc": summary["auc"] if summary else None,
        "logloss": summary["logloss"] if summary else None,
        "samples_per_s": summary["samples_per_s"] if summary else None,
        "cross_host_bytes_measured": cross_host,
    }


# ----------------------------------------------------------------------------- report


def summarize(raw: dict, args: argparse.Namespace) -> dict:
    """Ratios against flat, the best compression within the AUC bound, the simulator's fit."""
    schemes = raw["schemes"]
    flat = schemes["flat"]
    for r in schemes.values():
        r["speedup"] = flat["iteration_ms"] / r["iteration_ms"]
        r["embedding_forward_speedup"] = flat["embedding_forward_ms"] / r["embedding_forward_ms"]
    within = [k for k in schemes if k.startswith("dmt") and flat["auc"] - schemes[k]["auc"] <= AUC_TOLERANCE]
    best = max(within, key=lambda k: schemes[k]["speedup"]) if within else None
    summary = {
        "hosts": args.hosts,
        "ranks_per_host": args.ranks_per_host,
        "netns": not args.no_netns,
        "bandwidth": args.bandwidth,
        "latency_ms": args.latency_ms,
        "latency_emulated": args.latency_emulated,
        "global_batch": args.global_batch,
        "features": args.features,
        "dim": args.dim,
        "steps": args.steps,
        "schemes": schemes,
        "speedup_sptt": schemes["sptt"]["speedup"],
        "speedup_dmt": schemes[best]["speedup"] if best else None,
        "best_dmt": best,
        "simulator": simulator_fit(raw["calibration"], schemes, args),
    }
    return summary


def simulator_fit(calibration: dict, schemes: dict, args: argparse.Namespace) -> dict | None:
    """Links fitted to the measured all-to-alls; predicted vs measured forward output exchange."""
    from distrec.sim.iteration import Workload, predict_iteration

    cluster, links = fitted_cluster(calibration, args.hosts, args.ranks_per_host)
    if cluster is None:
        return {"error": links, "measurements": calibration} if links else None
    out = {"links": links, "flops_per_s": calibration["flops_per_s"], "measurements": calibration}
    for name, r in schemes.items():
        scheme, compression = ("dmt", r["compression"]) if name.startswith("dmt") else (name, 1.0)
        # only the embedding module: exchanges and, for DMT, the tower modules' compute
        workload = Workload(
            local_batch=args.global_batch // (args.hosts * args.ranks_per_host),
            num_features=args.features,
            embedding_dim=args.dim,
            dense_mflops=0.0,
            dense_params=0,
            tower_mflops=r.get("tower_mflops_per_sample", 0.0),
        )
        predicted = predict_iteration(workload, cluster, scheme, compression)
        # forward only: half the exchange (forward + backward), a third of the compute (forward + 2 x backward)
        forward = predicted.embedding_exchange / 2 + predicted.compute / 3
        out[name] = {
            "predicted_output_exchange_ms": forward,
            "measured_output_exchange_ms": r["output_exchange_ms"],
            "predicted_over_measured": forward / r["output_exchange_ms"],
        }
    for name in schemes:
        out[name]["predicted_speedup"] = out["flat"]["predicted_output_exchange_ms"] / out[name]["predicted_output_exchange_ms"]
        out[name]["measured_speedup"] = schemes["flat"]["output_exchange_ms"] / schemes[name]["output_exchange_ms"]
    return out


def plot(summary: dict, path: Path) -> None:
    names = list(summary["schemes"])
    fig, (ax,) = harness.figure(width=7)
    series = {"iteration": [summary["schemes"][n]["iteration_ms"] for n in names],
              "embedding forward": [summary["schemes"][n]["embedding_forward_ms"] for n in names]}  # fmt: skip
    harness.bars(ax, names, series, "ms per iteration (median)")
    ax.set_xlabel("scheme")
    delay = f"{summary['latency_ms']} ms" if summary["latency_emulated"] else "no added delay"
    link = f"{summary['bandwidth']}, {delay}" if summary["netns"] else "one machine, loopback"
    ax.set_title(f"{summary['hosts']} hosts x {summary['ranks_per_host']} ranks, {link}")
    harness.save_png(fig, path)


def print_table(summary: dict) -> None:
    from distrec.sim.report import format_table

    rows = []
    for name, r in summary["schemes"].items():
        measured = r["cross_host_bytes_measured"]
        rows.append(
            {
                "scheme": name,
                "iteration_ms": r["iteration_ms"],
                "embedding_fwd_ms": r["embedding_forward_ms"],
                "speedup": r["speedup"],
                "auc": r["auc"],
                "cross_MB_payload": r["cross_host_payload_bytes"] / 1e6,
                "cross_MB_link": measured / 1e6 if measured is not None else "-",
            }
        )
    print(format_table(rows, digits=3))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = dict(hosts=2, ranks_per_host=2, bandwidth="1gbit", latency_ms=0.2, global_batch=4096, features=16, dim=64, table_rows=5000,
                    steps=50, warmup=5, eval_rows=16384, lr=0.003, embedding_lr=0.03, compressions=[2.0, 4.0, 8.0])  # fmt: skip
    harness.add_options(p, defaults, {
        "bandwidth": "tc rate of every host link (default 1gbit)",
        "latency_ms": "host-to-host delay (ms, default 0.2)",
        "lr": "Adam learning rate of the dense layers and tower modules",
        "embedding_lr": "row-wise (lazy) Adam learning rate of the tables",
    })  # fmt: skip
    p.add_argument("--no-netns", action="store_true", help="plain processes on the loopback (CI-safe)")
    p.add_argument("--quick", action="store_true", help="a short run: fewer steps, smaller batch and model")
    p.add_argument("--out", default="runs/dmt_cluster", help="folder of the JSON and PNG results")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.global_batch, args.eval_rows, args.dim, args.table_rows = 20, 1024, 4096, 16, 1000
        args.warmup = 3
    world = args.hosts * args.ranks_per_host
    if args.global_batch % world or args.eval_rows % world or args.steps <= args.warmup:
        p.error("--global-batch and --eval-rows must be multiples of hosts x ranks-per-host, --steps > --warmup")
    if args.hosts > args.features:
        p.error("need at least one feature per host (--features >= --hosts)")
    return args


def main(argv: list[str] | None = None) -> dict:
    if started_as_rank(argv, worker):
        return {}
    args = parse_args(argv)
    summary = summarize(launch(args), args)
    out = Path(args.out)
    plot(summary, out / "dmt_cluster.png")
    print_table(summary)
    systems = [harness.SystemResult(name, "iteration time", "ms", harness.Samples(r["iteration_ms_per_step"])) for name, r in summary["schemes"].items()]
    return harness.finish(harness.ResultRecord("dmt_cluster", systems, summary["speedup_dmt"], summary), out / "dmt_cluster.json")


if __name__ == "__main__":
    main()
