"""``distrec train``: train a model on one process, or launch workers for many."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT, add_config_args, add_data_args, config_from_args
from distrec.errors import DistrecError

EXAMPLES = """
examples:
  distrec train --max-steps 300                       # synthetic Criteo-like data, tiny run
  distrec train --preset dlrm-kaggle --data-format criteo \\
      --data ../shared/data/criteo/criteo_kaggle_sample.tsv --split last:0.2 --out runs/criteo
  distrec train --data-format movielens --data ../shared/data/movielens --epochs 3 --out runs/ml
  distrec train --resume runs/criteo --max-steps 2000  # continue a run with a higher limit
  distrec train --config exp.yaml --set model.embedding_dim=32 --set train.warmup_steps=100
  distrec train --hotline --hot-budget 64MB --sample-rate 0.05 --relearn-every 200 --out runs/hot
  distrec train --nproc-per-node 4 --hosts 2 --ranks-per-host 2 --lookup sptt --towers towers.json --out runs/sptt
  distrec train --nproc-per-node 4 --hosts 2 --ranks-per-host 2 --lookup sptt --towers towers.json \
      --tower-module dlrm --compression 4 --out runs/dmt   # DMT-DLRM; summary.json gets "dmt"
  distrec train --nproc-per-node 4 --replica-groups 2 --sharding column_wise --out runs/2d   # 2 groups x 2 ranks
"""


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    add_config_args(train)
    add_data_args(train)
    train.add_argument("--split", metavar="SPEC", help="holdout: random:VAL[:TEST] or last:VAL[:TEST] (fractions), default random:0.1")
    train.add_argument("--max-ind-range", type=int, metavar="ROWS", help="rows per hashed table (default 100000)")
    train.add_argument("--epochs", type=int, metavar="N", help="passes over the training split (ignored when --max-steps is set)")
    train.add_argument("--max-steps", type=int, metavar="N", help="stop after N optimizer steps in total")
    train.add_argument("--batch-size", type=int, metavar="B", help="global mini-batch size in samples")
    train.add_argument("--lr", type=float, metavar="X", help="learning rate")
    train.add_argument("--optimizer", choices=["sgd", "adagrad", "adam"], help="optimizer (embeddings get its sparse, row-wise form)")
    train.add_argument("--eval-every", type=int, metavar="N", help="evaluate every N steps (and always at the end)")
    train.add_argument("--seed", type=int, metavar="S", help="random seed")
    train.add_argument("--out", metavar="DIR", help="run directory for config, metrics, summary and checkpoint (default runs/<time>)")
    train.add_argument("--resume", metavar="DIR", help="continue the run in DIR; raise --max-steps or --epochs to train further")
    dist_args = train.add_argument_group("distributed training")
    dist_args.add_argument("--nproc-per-node", type=int, metavar="N", help="launch N worker processes on this machine (torch's elastic launcher)")
    dist_args.add_argument("--max-restarts", type=int, default=0, metavar="N", help="restart the workers up to N times after a failure, from the last checkpoint")
    dist_args.add_argument("--plan", metavar="FILE", help="sharding plan JSON (default: a greedy table-wise plan, saved with the run)")
    dist_args.add_argument("--sharding", choices=["table_wise", "column_wise", "row_wise", "data_parallel"], help="shard every table this way instead of planning")
    dist_args.add_argument("--embeddings", choices=["sharded", "local"], help="sharded tables (default) or an independent full copy per rank")
    dist_args.add_argument("--memory-per-rank", metavar="SIZE", help="table memory limit per rank for the default planner, e.g. 4GB")
    dist_args.add_argument("--lookup", choices=["flat", "sptt"], help="embedding exchange: flat all-to-all (default) or DMT's SPTT by host")
    dist_args.add_argument("--hosts", type=int, metavar="H", help="hosts in the topology (default: from torchrun's environment)")
    dist_args.add_argument("--ranks-per-host", type=int, metavar="L", help="ranks per host (default: torchrun's LOCAL_WORLD_SIZE)")
    dist_args.add_argument("--towers", metavar="JSON", help="with --lookup sptt: tower partition from 'distrec partition', one tower per host")
    dist_args.add_argument("--tower-sharding", choices=["table_wise", "column_wise"], help="with --lookup sptt: split a tower's tables over its host's ranks by table (default) or by column")
    two_d = train.add_argument_group("2D sparse parallelism (shard within groups of ranks, replicate across them)")
    two_d.add_argument("--replica-groups", type=int, metavar="G", help="G groups of N/G consecutive ranks, each with every table sharded by a plan for N/G ranks (default 1: plain sharding)")
    two_d.add_argument("--replica-sync", choices=["exact", "periodic"], help="exact: average the touched rows' gradients across groups every step (default); periodic: average the replicas every --sync-every steps")
    two_d.add_argument("--sync-every", type=int, metavar="K", help="with --replica-sync periodic: steps between replica averages (default 10)")
    dmt = train.add_argument_group("DMT tower modules (with --lookup sptt, or in one process)")
    dmt.add_argument("--tower-module", choices=["dlrm", "dcn"], help="compress each tower's embeddings inside its host before they cross hosts")
    dmt.add_argument("--compression", type=float, metavar="X", help="floats crossing hosts shrink about X times (picks D; default 4)")
    dmt.add_argument("--tower-dim", type=int, metavar="D", help="width D of the tower modules' output vectors (instead of --compression)")
    dmt.add_argument("--tower-c", type=int, metavar="C", help="DLRM tower: outputs of width D per feature (default 1)")
    dmt.add_argument("--tower-p", type=int, metavar="P", help="DLRM tower: outputs of width D mixing all features (default 1)")
    hot = train.add_argument_group("Hotline (one process): hot rows in a fast tier, the rest in a slow tier (on CPU a file on disk)")
    hot.add_argument("--hotline", action="store_true", default=None, help="train with Hotline's two tiers and micro-batch pipeline")
    hot.add_argument("--hot-budget", metavar="SIZE", help="fast-tier bytes for hot rows, e.g. 512MB (default 512MB)")
    hot.add_argument("--sample-rate", type=float, metavar="X", help="fraction of mini-batches the access logger counts (default 0.05)")
    hot.add_argument("--relearn-every", type=int, metavar="N", help="re-select the hot set every N mini-batches (default 1000)")
    train.set_defaults(handler=run)


def _launch_workers(args: argparse.Namespace, argv: list[str], out: Path) -> int:
    """Re-run this command in ``--nproc-per-node`` workers under torch's elastic launcher.

    Each worker gets ``OMP_NUM_THREADS`` = cores / workers unless it is set. A worker that
    fails prints its own one-line error; the launcher's report becomes one line here.
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    worker_argv = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--nproc-per-node", "--max-restarts"):
            skip = True
            continue
        if a.startswith(("--nproc-per-node=", "--max-restarts=")):
            continue
        worker_argv.append(a)
    if args.resume is None and args.out is None:
        worker_argv += ["--out", str(out)]  # one run directory for all workers
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc_per_node)))
    launcher = ["--standalone", "--nnodes", "1", "--nproc-per-node", str(args.nproc_per_node), "--max-restarts", str(args.max_restarts)]
    try:
        torchrun.main(launcher + ["-m", "distrec", *worker_argv])
    except ChildFailedError as e:
        codes = sorted({f.exitcode for f in e.failures.values()})
        raise DistrecError(
            f"{len(e.failures)} of {args.nproc_per_node} workers failed (exit code {', '.join(map(str, codes))}) "
            f"after {args.max_restarts} restart(s); see their messages above, fix the cause and rerun (or add --resume {out})"
        ) from None
    return 0


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.data.fingerprint import check_run_data, resolve_paths
    from distrec.train.loop import train
    from distrec.train.run import check_run, resume_config

    if args.resume:
        given = [f for f in ("config", "preset", "data", "data_format", "schema", "split", "max_ind_range", "batch_size", "lr", "optimizer", "seed", "tower_module", "compression", "tower_dim", "tower_c", "tower_p") if getattr(args, f, None) is not None]
        if given or args.overrides or (args.out and Path(args.out) != Path(args.resume)):
            what = "--" + given[0].replace("_", "-") if given else ("--set" if args.overrides else "--out")
            raise DistrecError(
                f"{what} cannot change a resumed run; --resume DIR takes only --max-steps, --epochs, --eval-every "
                "and, to reshard, --nproc-per-node, --plan, --sharding, --memory-per-rank and --replica-groups"
            )
        parallel = {k: getattr(args, k) for k in ("plan", "sharding", "memory_per_rank", "replica_groups") if getattr(args, k) is not None}
        cfg = resume_config(Path(args.resume), epochs=args.epochs, max_steps=args.max_steps, eval_every=args.eval_every, parallel=parallel)
        out = Path(args.resume)
        check_run_data(out, cfg.data)  # before any worker starts; the trainer checks again
    else:
        cfg = config_from_args(args)
        resolve_paths(cfg.data)  # the saved config names the same files from any working directory
        out = Path(args.out) if args.out else _default_out()
    if args.nproc_per_node is not None and "LOCAL_RANK" not in os.environ:
        if args.nproc_per_node < 1:
            raise DistrecError(f"--nproc-per-node is {args.nproc_per_node}; it must be at least 1")
        check_run(cfg, args.nproc_per_node, progress=not args.no_progress)
        return _launch_workers(args, argv, out)
    resume = bool(args.resume) or _restarted_with_checkpoint(out)
    summary = train(cfg, out, resume=resume, progress=not args.no_progress)
    if summary is not None:
        if "dmt" in summary:
            print(dmt_line(summary["dmt"]))
        print(json.dumps(summary))
    return 0


def dmt_line(cost: dict) -> str:
    """One line comparing a DMT model's size and compute with its baseline's."""
    return (
        f"DMT ({cost['tower_module']} towers, D={cost['tower_dim']}): {cost['compression']:.2f}x fewer floats cross hosts, "
        f"{cost['mflops_per_sample']:.4f} MFLOPs/sample (baseline {cost['baseline_mflops_per_sample']:.4f}), "
        f"{cost['dense_parameters']:,} dense parameters (baseline {cost['baseline_dense_parameters']:,})"
    )


def _restarted_with_checkpoint(out: Path) -> bool:
    """Whether the elastic launcher restarted this worker and the run has a checkpoint to resume."""
    from distrec.train.checkpoint import has_checkpoint

    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and has_checkpoint(out)


def _default_out() -> Path:
    import time

    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")
