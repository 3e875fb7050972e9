"""``distrec train``: train a model on one process, or launch workers for many."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT, add_config_args, add_data_args, add_trust_arg, check_at_least, config_from_args, trusting
from distrec.cli.failures import WORKER_ERRORS_ENV, Interrupted, announcing_restarts, first_worker_failure
from distrec.errors import DistrecError

EXAMPLES = """
examples:
  distrec train --max-steps 300                       # synthetic Criteo-like data, tiny run
  distrec train --preset dlrm-kaggle --data-format criteo \\
      --data ../shared/data/criteo/criteo_kaggle_sample.tsv --split last:0.2 --out runs/criteo
  distrec train --data-format movielens --data ../shared/data/movielens --out runs/ml   # until the AUC stops improving
  distrec train --resume runs/criteo --max-steps 2000  # continue a run with a higher limit
  distrec train --config exp.yaml --set model.embedding_dim=32 --set train.warmup_steps=100
  distrec train --hotline --hot-budget 64MB --sample-rate 0.25 --relearn-every 40 --out runs/hot
  distrec train --nproc-per-node 4 --hosts 2 --ranks-per-host 2 --lookup sptt --towers towers.json --out runs/sptt
  distrec train --nproc-per-node 4 --hosts 2 --ranks-per-host 2 --lookup sptt --towers towers.json \\
      --tower-module dlrm --compression 4 --out runs/dmt   # DMT-DLRM; summary.json gets "dmt"
  distrec train --nproc-per-node 4 --replica-groups 2 --sharding column_wise --out runs/2d   # 2 groups x 2 ranks
"""


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    add_config_args(train)
    add_data_args(train)
    train.add_argument("--split", metavar="SPEC", help="holdout: random:VAL[:TEST] or last:VAL[:TEST] (fractions), default random:0.1")
    train.add_argument("--max-ind-range", type=int, metavar="ROWS", help="rows per hashed table (default 100000)")
    train.add_argument(
        "--epochs",
        type=int,
        metavar="N",
        help="passes over the training split (ignored when --max-steps is set; default: until the validation AUC stops improving)",
    )
    train.add_argument("--max-steps", type=int, metavar="N", help="stop after N optimizer steps in total")
    train.add_argument("--patience", type=int, metavar="N", help="without --epochs/--max-steps: stop after N evaluations without a better AUC (default 5)")
    train.add_argument("--batch-size", type=int, metavar="B", help="global mini-batch size in samples (default: from the training rows, 64 to 1024)")
    train.add_argument("--lr", type=float, metavar="X", help="learning rate (default: the optimizer's; sgd 0.1, adagrad 0.01, adam 0.001)")
    train.add_argument(
        "--optimizer",
        choices=["sgd", "adagrad", "adam"],
        help="optimizer, embeddings get its sparse, row-wise form (default: adam for the dense layers, row-wise adagrad for the embeddings)",
    )
    train.add_argument(
        "--eval-every", type=int, metavar="N", help="evaluate every N steps and at the end (default: at the end, or 4 times per epoch without a fixed length)"
    )
    train.add_argument("--seed", type=int, metavar="S", help="random seed")
    train.add_argument("--out", metavar="DIR", help="run directory for config, metrics, summary and checkpoint (default runs/<time>)")
    train.add_argument("--resume", metavar="DIR", help="continue the run in DIR; raise --max-steps or --epochs to train further")
    train.add_argument(
        "--tensorboard",
        action="store_true",
        default=None,
        help="also write the metrics, speed and time breakdown as TensorBoard scalars into OUT/tensorboard (pip install 'distrec[tensorboard]')",
    )
    train.add_argument("--overwrite", action="store_true", help="replace the run already in --out (by default an --out that holds files is refused)")
    add_trust_arg(train)
    dist_args = train.add_argument_group("distributed training")
    dist_args.add_argument("--nproc-per-node", type=int, metavar="N", help="launch N worker processes on this machine (torch's elastic launcher)")
    dist_args.add_argument(
        "--max-restarts", type=int, default=0, metavar="N", help="restart the workers up to N times after a failure, from the last checkpoint (default 0)"
    )
    dist_args.add_argument(
        "--timeout-seconds", type=float, metavar="S", help="fail a collective that waits S seconds for a silent rank, naming it (default 600)"
    )
    dist_args.add_argument("--plan", metavar="FILE", help="sharding plan JSON (default: a greedy table-wise plan, saved with the run)")
    dist_args.add_argument(
        "--sharding", choices=["table_wise", "column_wise", "row_wise", "data_parallel"], help="shard every table this way instead of planning"
    )
    dist_args.add_argument("--embeddings", choices=["sharded", "local"], help="sharded tables (default) or an independent full copy per rank")
    dist_args.add_argument("--memory-per-rank", metavar="SIZE", help="table memory limit per rank for the default planner, e.g. 4GB")
    dist_args.add_argument("--lookup", choices=["flat", "sptt"], help="embedding exchange: flat all-to-all (default) or DMT's SPTT by host")
    dist_args.add_argument("--hosts", type=int, metavar="H", help="hosts in the topology (default: from torchrun's environment)")
    dist_args.add_argument("--ranks-per-host", type=int, metavar="L", help="ranks per host (default: torchrun's LOCAL_WORLD_SIZE)")
    dist_args.add_argument(
        "--towers",
        metavar="JSON",
        help="with --lookup sptt: tower partition from 'distrec partition', one tower per host (per K hosts with --hosts-per-tower K)",
    )
    dist_args.add_argument(
        "--tower-sharding",
        choices=["table_wise", "column_wise", "row_wise"],
        help="with --lookup sptt: split a tower's tables over its host's ranks by table (default), by column or by row (large tables)",
    )
    dist_args.add_argument(
        "--hosts-per-tower", type=int, metavar="K", help="with --lookup sptt: each tower spans K hosts, so there are hosts / K towers (default 1)"
    )
    two_d = train.add_argument_group("2D sparse parallelism (shard within groups of ranks, replicate across them)")
    two_d.add_argument(
        "--replica-groups",
        type=int,
        metavar="G",
        help="G groups of N/G consecutive ranks, each with every table sharded by a plan for N/G ranks (default 1: plain sharding)",
    )
    two_d.add_argument(
        "--replica-sync",
        choices=["exact", "periodic"],
        help="exact: average the touched rows' gradients across groups every step (default); periodic: average the replicas every --sync-every steps",
    )
    two_d.add_argument("--sync-every", type=int, metavar="K", help="with --replica-sync periodic: steps between replica averages (default 10)")
    two_d.add_argument(
        "--replica-average",
        choices=["auto", "all", "touched"],
        help="with --replica-sync periodic: a row's mean over all groups, or merged from the groups that touched it since the last sync (default auto: touched for Adagrad and Adam, all for SGD)",
    )
    dmt = train.add_argument_group("DMT tower modules (with --lookup sptt, or in one process)")
    dmt.add_argument("--tower-module", choices=["dlrm", "dcn"], help="compress each tower's embeddings inside its host before they cross hosts")
    dmt.add_argument("--compression", type=float, metavar="X", help="floats crossing hosts shrink about X times (picks D; default 4)")
    dmt.add_argument("--tower-dim", type=int, metavar="D", help="width D of the tower modules' output vectors (instead of --compression)")
    dmt.add_argument("--tower-c", type=int, metavar="C", help="DLRM tower: outputs of width D per feature (default 1)")
    dmt.add_argument("--tower-p", type=int, metavar="P", help="DLRM tower: outputs of width D mixing all features (default 1)")
    hot = train.add_argument_group(
        "Hotline (one process or --nproc-per-node N): hot rows in a fast tier (replicated on every rank), "
        "the rest in a slow tier (in one process on CPU a file on disk, else sharded over the ranks)"
    )
    hot.add_argument("--hotline", action="store_true", default=None, help="train with Hotline's hot set and micro-batch pipeline")
    hot.add_argument("--hot-budget", metavar="SIZE", help="fast-tier bytes for hot rows, e.g. 512MB (default 512MB)")
    hot.add_argument("--sample-rate", type=float, metavar="X", help="fraction of mini-batches the access logger counts (default 0.05)")
    hot.add_argument("--relearn-every", type=int, metavar="N", help="re-select the hot set every N mini-batches (default 1000)")
    train.set_defaults(handler=run)


@contextmanager
def _quiet_launcher(announce_failures: bool) -> Iterator[None]:
    """Few log lines in this process during the block: torch's elastic launcher logs each
    signal and failed worker, repeating what the workers and this command report. With
    ``announce_failures`` its error lines stay (``announcing_restarts`` turns the one about each
    failed attempt into a line of ours)."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING if announce_failures else logging.ERROR)
    try:
        yield
    finally:
        logging.disable(before)


def _launch_workers(args: argparse.Namespace, argv: list[str], out: Path) -> int:
    """Re-run this command in ``--nproc-per-node`` workers under torch's elastic launcher.

    Each worker gets ``OMP_NUM_THREADS`` = cores / workers unless it is set. The workers
    report failures into a directory instead of stderr; the first one (the root cause: the
    other ranks fail after it) is printed here, once. Returns the exit status.
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from distrec.components.checkpoint import has_checkpoint

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
    if args.resume is None and not args.overwrite:
        worker_argv.append("--overwrite")  # checked here; rank 0's files must not stop the others
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc_per_node)))
    launcher = ["--standalone", "--nnodes", "1", "--nproc-per-node", str(args.nproc_per_node), "--max-restarts", str(args.max_restarts)]
    with (
        tempfile.TemporaryDirectory(prefix="distrec-worker-errors-") as errors,
        _quiet_launcher(announce_failures=args.max_restarts > 0),
        announcing_restarts(args.max_restarts, Path(errors), lambda: _restart_point(out)),
    ):
        os.environ[WORKER_ERRORS_ENV] = errors
        try:
            torchrun.main(launcher + ["-m", "distrec", *worker_argv])
        except SignalException as e:
            raise Interrupted(e.sigval) from None
        except ChildFailedError as e:
            first = first_worker_failure(Path(errors))
            if first is None:  # killed before it could report (a signal, out of memory)
                codes = sorted({f.exitcode for f in e.failures.values()})
                resume = f" (or continue with --resume {out})" if has_checkpoint(out) else ""
                raise DistrecError(
                    f"{len(e.failures)} of {args.nproc_per_node} workers failed (exit code {', '.join(map(str, codes))}) "
                    f"after {args.max_restarts} restart(s) without a message; fix the cause and rerun{resume}"
                ) from None
            print(first, file=sys.stderr)
            return 2 if first.startswith("distrec: error: ") else 1
        finally:
            del os.environ[WORKER_ERRORS_ENV]
    return 0


def _check_out(out: Path) -> None:
    """DistrecError when ``out`` already holds files (an earlier run would be destroyed)."""
    if out.exists() and not out.is_dir():
        raise DistrecError(f"--out {str(out)!r} is a file; pass a directory for the run")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held:
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise DistrecError(
            f"--out {str(out)!r} already holds files ({shown}); pass --resume {out} to continue that run, --overwrite to replace it, or another --out"
        )


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.data.fingerprint import check_run_data, resolve_paths
    from distrec.parallel.comm import exit_without_finalizing, init_from_env, leave_process_group, naming_silent_ranks
    from distrec.train.evaluate import default_device
    from distrec.train.loop import train
    from distrec.train.run import check_run, resume_config
    from distrec.train.tensorboard import require_tensorboard

    check_at_least("--max-restarts", args.max_restarts, 0)
    check_at_least("--nproc-per-node", args.nproc_per_node, 1)
    if args.timeout_seconds is not None and not args.timeout_seconds > 0:
        raise DistrecError(f"--timeout-seconds is {args.timeout_seconds}; give a positive number of seconds")
    if args.resume:
        given = [
            f
            for f in (
                "config",
                "preset",
                "data",
                "data_format",
                "schema",
                "split",
                "max_ind_range",
                "batch_size",
                "lr",
                "optimizer",
                "seed",
                "tower_module",
                "compression",
                "tower_dim",
                "tower_c",
                "tower_p",
            )
            if getattr(args, f, None) is not None
        ]
        if given or args.overrides or args.overwrite or (args.out and Path(args.out) != Path(args.resume)):
            what = "--" + given[0].replace("_", "-") if given else ("--set" if args.overrides else "--overwrite" if args.overwrite else "--out")
            raise DistrecError(
                f"{what} cannot change a resumed run; --resume DIR takes only --max-steps, --epochs, --eval-every, --timeout-seconds, "
                "--tensorboard, --trust-checkpoint and, to reshard, --nproc-per-node, --plan, --sharding, --memory-per-rank and --replica-groups"
            )
        parallel = {k: getattr(args, k) for k in ("plan", "sharding", "memory_per_rank", "replica_groups", "timeout_seconds") if getattr(args, k) is not None}
        cfg = resume_config(Path(args.resume), epochs=args.epochs, max_steps=args.max_steps, eval_every=args.eval_every, parallel=parallel)
        cfg.train.tensorboard = cfg.train.tensorboard or bool(args.tensorboard)
        out = Path(args.resume)
        check_run_data(out, cfg.data)  # before any worker starts; the trainer checks again
    else:
        if args.trust_checkpoint:
            raise DistrecError("--trust-checkpoint applies to a checkpoint being loaded; use it with --resume DIR")
        cfg = config_from_args(args)
        resolve_paths(cfg.data)  # the saved config names the same files from any working directory
        out = Path(args.out) if args.out else _default_out()
    if not (args.resume or args.overwrite or _restart_count() > 0):
        _check_out(out)
    if cfg.train.tensorboard:
        require_tensorboard()
    try:
        if args.nproc_per_node is not None and "LOCAL_RANK" not in os.environ:
            check_run(cfg, args.nproc_per_node, progress=not args.no_progress)
            return _launch_workers(args, argv, out)
        timeout = cfg.parallel.timeout_seconds
        with trusting(args), naming_silent_ranks(timeout):
            init_from_env(default_device(), timeout)  # the trainer joins this group
            summary = train(cfg, out, resume=bool(args.resume) or _restarted_with_checkpoint(out), progress=not args.no_progress)
            leave_process_group()
    except KeyboardInterrupt as e:
        raise Interrupted(getattr(e, "signum", signal.SIGINT), _what_was_kept(out)) from None
    if summary is not None:
        if "dmt" in summary:
            print(dmt_line(summary["dmt"]))
        print(json.dumps(summary))
    if "LOCAL_RANK" in os.environ:  # a worker that used a process group
        exit_without_finalizing(0)
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
    from distrec.components.checkpoint import has_checkpoint

    return _restart_count() > 0 and has_checkpoint(out)


def _what_was_kept(out: Path) -> str:
    """What an interrupted run leaves: the last complete checkpoint and how to continue."""
    from distrec.components.checkpoint import find_checkpoint, has_checkpoint, read_meta

    if not has_checkpoint(out):
        return f"no checkpoint was written in {str(out)!r} yet"
    try:
        step = read_meta(find_checkpoint(out))["step"]
    except DistrecError:
        return f"the checkpoint in {str(out)!r} is unreadable"
    return f"the checkpoint of step {step} in {str(out)!r} is intact: continue with 'distrec train --resume {out}'"


def _restart_point(out: Path) -> str:
    """Where restarted workers continue: the step of the run's last checkpoint, or the start."""
    from distrec.components.checkpoint import find_checkpoint, has_checkpoint, read_meta

    if not has_checkpoint(out):
        return "from the start (no checkpoint yet)"
    try:
        return f"from step {read_meta(find_checkpoint(out))['step']}"
    except DistrecError:
        return "from the last checkpoint"


def _restart_count() -> int:
    """How often the elastic launcher restarted this worker (0 outside a launcher)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _default_out() -> Path:
    import time

    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")
