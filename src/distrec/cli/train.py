"""``distrec train``: train a model on one process, or launch workers for many."""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from distrec.cli.args import EXAMPLES_FORMAT, add_config_args, add_data_args, add_trust_arg, check_at_least, check_hotline_flags, config_from_args, trusting
from distrec.cli.failures import WORKER_ERRORS_ENV, Interrupted, announcing_restarts, first_worker_failure, killed_rank, worker_failure
from distrec.cli.flags import FLAGS, add_flags
from distrec.cli.orphans import LAUNCHER_PID_ENV, stop_with_launcher
from distrec.errors import DistrecError

if TYPE_CHECKING:
    from distrec.config import RunConfig

EXAMPLES = """
examples:
  distrec train --max-steps 300                       # synthetic Criteo-like data, tiny run
  distrec train --preset dlrm-kaggle --data-format criteo \\
      --data ../shared/data/criteo/criteo_kaggle_sample.tsv --split last:0.2 --out runs/criteo
  distrec train --data-format movielens --data ../shared/data/movielens --out runs/ml   # until the loss stops improving
  distrec train --resume runs/criteo --max-steps 2000  # continue a run with a higher limit
  distrec train --config exp.yaml --set model.embedding_dim=32 --set train.warmup_steps=100
  distrec train --hotline --hot-budget 64MB --sample-rate 0.25 --relearn-every 40 --out runs/hot
  distrec train --nproc-per-node 4 --hosts 2 --ranks-per-host 2 --lookup sptt --towers towers.json --out runs/sptt
  distrec train --nproc-per-node 4 --hosts 2 --ranks-per-host 2 --lookup sptt --towers towers.json \\
      --tower-module dlrm --compression 4 --out runs/dmt   # DMT-DLRM; summary.json gets "dmt"
  distrec train --nproc-per-node 4 --replica-groups 2 --sharding column_wise --out runs/2d   # 2 groups x 2 ranks
"""

RESUMABLE = ("max_steps", "epochs", "eval_every", "timeout_seconds", "tensorboard", "plan", "sharding", "memory_per_rank", "replica_groups")
"""The config flags (by dest) that ``--resume`` takes: a longer run, a new sharding; any other
config flag, --config and --preset would change the resumed run, so they are refused."""


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    add_config_args(train)
    add_data_args(train)
    add_flags(train, "train")
    train.add_argument("--out", metavar="DIR", help="run directory for config, metrics, summary and checkpoint (default runs/<time>)")
    train.add_argument("--resume", metavar="DIR", help="continue the run in DIR; raise --max-steps or --epochs to train further")
    train.add_argument("--overwrite", action="store_true", help="replace the run already in --out (by default an --out that holds files is refused)")
    add_trust_arg(train)
    dist_args = train.add_argument_group("distributed training")
    dist_args.add_argument("--nproc-per-node", type=int, metavar="N", help="launch N worker processes on this machine (torch's elastic launcher)")
    dist_args.add_argument(
        "--max-restarts", type=int, default=0, metavar="N", help="restart the workers up to N times after a failure, from the last checkpoint (default 0)"
    )
    add_flags(dist_args, "distributed")
    add_flags(train.add_argument_group("2D sparse parallelism (shard within groups of ranks, replicate across them)"), "2d")
    add_flags(train.add_argument_group("DMT tower modules (with --lookup sptt, or in one process)"), "dmt")
    hotline = train.add_argument_group(
        "Hotline (one process or --nproc-per-node N): hot rows in a fast tier (replicated on every rank), "
        "the rest in a slow tier (in one process on CPU a file on disk, else sharded over the ranks)"
    )
    add_flags(hotline, "hotline")
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

    Each worker gets ``OMP_NUM_THREADS`` = cores / workers unless it is set, and stops when
    this process ends (``orphans``). The workers report failures into a directory instead of
    stderr; one line is printed here on the root cause (the other ranks fail after it, losing
    their peer): see ``_report_failed_workers``. Returns the exit status.
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
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
        os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the workers stop when this process ends
        try:
            torchrun.main(launcher + ["-m", "distrec", *worker_argv])
        except SignalException as e:
            raise Interrupted(e.sigval) from None
        except ChildFailedError as e:
            return _report_failed_workers({rank: (f.exitcode, f.timestamp) for rank, f in e.failures.items()}, Path(errors), out, args)
        finally:
            del os.environ[WORKER_ERRORS_ENV], os.environ[LAUNCHER_PID_ENV]
    return 0


def _report_failed_workers(failures: dict[int, tuple[int, float]], errors: Path, out: Path, args: argparse.Namespace) -> int:
    """Print one line on why the workers failed (rank -> exit code, when the launcher saw it);
    the exit status. A worker killed by a signal cannot report: it is named, with how to
    continue, and the others' errors (losing their peer) are left out; else the first
    error a worker reported is printed."""
    killed = killed_rank(failures)
    first = first_worker_failure(errors) if killed is None else None
    if first is not None:
        print(first, file=sys.stderr)
        return 2 if first.startswith("distrec: error: ") else 1
    if killed is not None:
        what = worker_failure(*killed, errors, args.max_restarts)
    else:
        codes = ", ".join(map(str, sorted({code for code, _ in failures.values()})))
        what = f"{len(failures)} of {args.nproc_per_node} workers failed (exit code {codes}) without a message"
    after = f" after {args.max_restarts} restart(s)" if args.max_restarts else ""
    print(f"distrec: error: {what}{after}; {_what_was_kept(out, args.nproc_per_node)}", file=sys.stderr)
    return 1


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
    from distrec.train.run import resume_config

    stop_with_launcher()  # a worker: before it does anything that its launcher's death should end
    check_at_least("--max-restarts", args.max_restarts, 0)
    check_at_least("--nproc-per-node", args.nproc_per_node, 1)
    if args.timeout_seconds is not None and not args.timeout_seconds > 0:
        raise DistrecError(f"--timeout-seconds is {args.timeout_seconds}; give a positive number of seconds")
    if args.resume:
        given = [d for d in ("config", "preset", *(f.dest for f in FLAGS)) if d not in RESUMABLE and getattr(args, d, None) is not None]
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
        check_hotline_flags(args, cfg)
        resolve_paths(cfg.data)  # the saved config names the same files from any working directory
        out = Path(args.out) if args.out else _default_out()
    with holding_run(out) if "LOCAL_RANK" not in os.environ else nullcontext():  # workers run under their launcher's lock
        return _train_into(args, argv, cfg, out)


def _train_into(args: argparse.Namespace, argv: list[str], cfg: RunConfig, out: Path) -> int:
    """Train ``cfg`` into ``out``: here, or in launched workers with ``--nproc-per-node``."""
    from distrec.parallel.comm import exit_without_finalizing, init_from_env, leave_process_group, naming_silent_ranks
    from distrec.train.evaluate import default_device
    from distrec.train.loop import train
    from distrec.train.run import check_run
    from distrec.train.tensorboard import require_tensorboard

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
            print(dmt_line(summary["dmt"]), file=sys.stderr)  # standard output holds the JSON line only
        print(json.dumps(summary))
    if "LOCAL_RANK" in os.environ:  # a worker that used a process group
        exit_without_finalizing(0)
    return 0


@contextmanager
def holding_run(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on the run directory ``out`` for the block (``.NAME.lock`` beside
    it, with this process's pid), so that no second distrec trains into it meanwhile."""
    lock = out.parent / f".{out.name}.lock"
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise DistrecError(f"cannot write a run directory at {str(out)!r} ({e.strerror}); pass an --out in a writable directory") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise DistrecError(f"another distrec (pid {holder}) is training in {str(out)!r}; wait for it to end, or pass another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)  # before the lock goes: a newcomer then makes its own file
    finally:
        os.close(fd)


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


def _what_was_kept(out: Path, procs: int | None = None) -> str:
    """What a stopped run leaves: the last complete checkpoint and how to continue, on
    ``procs`` processes (default: as many as saved the checkpoint)."""
    from distrec.components.checkpoint import find_checkpoint, has_checkpoint, read_meta

    if not has_checkpoint(out):
        return f"no checkpoint was written in {str(out)!r} yet: start the run again with --overwrite"
    try:
        meta = read_meta(find_checkpoint(out))
    except DistrecError:
        return f"the checkpoint in {str(out)!r} is unreadable"
    procs = procs or int(meta.get("world_size", 1))
    resume = f"distrec train --resume {out}" + (f" --nproc-per-node {procs}" if procs > 1 else "")
    return f"the checkpoint of step {meta['step']} in {str(out)!r} is intact: continue with '{resume}'"


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
