"""The ``distrec`` command line: train, evaluate, data. Every error is one line, exit 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from distrec import __version__
from distrec.errors import DistrecError

TRAIN_EXAMPLES = """
examples:
  distrec train --max-steps 300                       # synthetic Criteo-like data, tiny run
  distrec train --preset dlrm-kaggle --data-format criteo \\
      --data ../shared/data/criteo/criteo_kaggle_sample.tsv --split last:0.2 --out runs/criteo
  distrec train --data-format movielens --data ../shared/data/movielens --epochs 3 --out runs/ml
  distrec train --resume runs/criteo --max-steps 2000  # continue a run with a higher limit
  distrec train --config exp.yaml --set model.embedding_dim=32 --set train.warmup_steps=100
"""

EVALUATE_EXAMPLES = """
examples:
  distrec evaluate --checkpoint runs/criteo --data ../shared/data/criteo/criteo_kaggle_tiny.tsv \\
      --data-format criteo
"""

REPORT_EXAMPLES = """
examples:
  distrec report runs/tw2 runs/cw2 runs/rw2 -o breakdown.png   # one bar per run
"""

DATA_EXAMPLES = """
examples:
  distrec data prepare --data-format criteo --data day_0.gz       # parse once into the cache
  distrec data prepare --data-format csv --data clicks.csv --schema schema.yaml
  distrec data synth -o synthetic.tsv --rows 100000 --set data.synthetic.zipf_exponent=1.2
"""


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", metavar="PATH", help="input file or directory (default: generated synthetic data)")
    p.add_argument("--data-format", choices=["criteo", "movielens", "csv", "parquet", "synthetic"], help="input format")
    p.add_argument("--schema", metavar="FILE", help="YAML schema for csv/parquet: label, dense and categorical columns")
    p.add_argument("--cache-dir", metavar="DIR", help="where parsed data is cached (default $DISTREC_CACHE or ~/.cache/distrec)")
    p.add_argument("--strict", action="store_true", default=None, help="stop at the first malformed row instead of skipping it")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", metavar="NAME", help="architecture preset: dlrm-kaggle, dlrm-terabyte, dlrm-mlperf, dcn, tiny")
    p.add_argument("--config", metavar="FILE", help="YAML experiment config (sections data, model, train)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides", help="override a config field, e.g. model.embedding_dim=64 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distrec",
        description="Train large-embedding recommendation models (DLRM, DCN) on one machine or many.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="run 'distrec COMMAND --help' for a command's options and examples",
    )
    parser.add_argument("--version", action="version", version=f"distrec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter

    train = sub.add_parser("train", help="train a model", epilog=TRAIN_EXAMPLES, formatter_class=fmt)
    _add_config_args(train)
    _add_data_args(train)
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

    evaluate = sub.add_parser("evaluate", help="evaluate a checkpoint on data", epilog=EVALUATE_EXAMPLES, formatter_class=fmt)
    evaluate.add_argument("--checkpoint", required=True, metavar="DIR", help="a run directory or its checkpoint/ folder")
    _add_data_args(evaluate)
    evaluate.add_argument("--batch-size", type=int, default=16384, metavar="B", help="evaluation batch size")

    data = sub.add_parser("data", help="prepare or generate data", epilog=DATA_EXAMPLES, formatter_class=fmt)
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION")
    prepare = data_sub.add_parser("prepare", help="parse input once into the columnar cache", epilog=DATA_EXAMPLES, formatter_class=fmt)
    _add_config_args(prepare)
    _add_data_args(prepare)
    synth = data_sub.add_parser("synth", help="write synthetic Criteo-format TSV", epilog=DATA_EXAMPLES, formatter_class=fmt)
    _add_config_args(synth)
    synth.add_argument("-o", "--output", required=True, metavar="FILE", help="TSV file to write (.gz compresses)")
    synth.add_argument("--rows", type=int, metavar="N", help="rows to write (default data.synthetic.rows)")
    synth.add_argument("--seed", type=int, metavar="S", help="generator seed (default data.synthetic.seed)")
    synth.add_argument("--no-progress", action="store_true", help="no progress bar")
    report = sub.add_parser("report", help="plot the time breakdown of runs", epilog=REPORT_EXAMPLES, formatter_class=fmt)
    report.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories holding breakdown.json")
    report.add_argument("-o", "--output", metavar="PNG", help="image to write (default RUN_DIR/breakdown.png of the first run)")
    return parser


def _report(args: argparse.Namespace) -> int:
    from distrec.report import plot_breakdowns

    output = Path(args.output) if args.output else Path(args.runs[0]) / "breakdown.png"
    plot_breakdowns([Path(r) for r in args.runs], output)
    print(json.dumps({"output": str(output)}))
    return 0


def _config_from_args(args: argparse.Namespace):
    from distrec import config

    overrides = list(args.overrides)
    mapping = {
        "data": "data.path",
        "data_format": "data.format",
        "schema": "data.schema",
        "cache_dir": "data.cache_dir",
        "strict": "data.strict",
        "split": "data.split",
        "max_ind_range": "data.max_ind_range",
        "epochs": "train.epochs",
        "max_steps": "train.max_steps",
        "batch_size": "train.batch_size",
        "lr": "train.lr",
        "optimizer": "train.optimizer",
        "eval_every": "train.eval_every",
        "seed": "train.seed",
        "plan": "parallel.plan",
        "sharding": "parallel.sharding",
        "embeddings": "parallel.embeddings",
        "memory_per_rank": "parallel.memory_per_rank",
    }
    for attr, key in mapping.items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    if getattr(args, "data", None) and getattr(args, "data_format", None) is None:
        raise DistrecError("--data needs --data-format (criteo, movielens, csv, parquet or synthetic)")
    return config.load(args.config, overrides, preset=args.preset)


def _launch_workers(args: argparse.Namespace, argv: list[str]) -> int:
    """Re-run this command in ``--nproc-per-node`` workers under torch's elastic launcher."""
    from torch.distributed import run as torchrun

    if args.nproc_per_node < 1:
        raise DistrecError(f"--nproc-per-node is {args.nproc_per_node}; it must be at least 1")
    worker_argv = []
    skip = False
    for i, a in enumerate(argv):
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
        worker_argv += ["--out", str(_default_out())]  # one run directory for all workers
    launcher = ["--standalone", "--nnodes", "1", "--nproc-per-node", str(args.nproc_per_node), "--max-restarts", str(args.max_restarts)]
    torchrun.main(launcher + ["-m", "distrec", *worker_argv])
    return 0


def _train(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.train.loop import resume_config, train

    if args.nproc_per_node is not None and "LOCAL_RANK" not in os.environ:
        return _launch_workers(args, argv)

    if args.resume:
        given = [f for f in ("config", "preset", "data", "data_format", "schema", "split", "max_ind_range", "batch_size", "lr", "optimizer", "seed") if getattr(args, f, None) is not None]
        if given or args.overrides or (args.out and Path(args.out) != Path(args.resume)):
            what = "--" + given[0].replace("_", "-") if given else ("--set" if args.overrides else "--out")
            raise DistrecError(f"{what} cannot change a resumed run; --resume DIR takes only --max-steps, --epochs and --eval-every")
        cfg = resume_config(Path(args.resume), epochs=args.epochs, max_steps=args.max_steps, eval_every=args.eval_every)
        out = Path(args.resume)
    else:
        cfg = _config_from_args(args)
        out = Path(args.out) if args.out else _default_out()
    resume = bool(args.resume) or _restarted_with_checkpoint(out)
    summary = train(cfg, out, resume=resume, progress=not args.no_progress)
    if summary is not None:
        print(json.dumps(summary))
    return 0


def _restarted_with_checkpoint(out: Path) -> bool:
    """Whether the elastic launcher restarted this worker and the run has a checkpoint to resume."""
    from distrec.train.checkpoint import has_checkpoint

    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and has_checkpoint(out)


def _default_out() -> Path:
    import time

    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def _evaluate(args: argparse.Namespace) -> int:
    from distrec.train.loop import evaluate_checkpoint

    result = evaluate_checkpoint(
        Path(args.checkpoint),
        data_path=args.data,
        data_format=args.data_format,
        schema=args.schema,
        cache_dir=args.cache_dir,
        strict=args.strict,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    print(json.dumps(result))
    return 0


def _data(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.data_command == "prepare":
        from distrec.data import prepare, read_manifest

        cfg = _config_from_args(args)
        cache = prepare(cfg.data, progress=not args.no_progress)
        manifest = read_manifest(cache)
        print(json.dumps({"cache": str(cache), **{k: manifest[k] for k in ("rows", "malformed_rows", "malformed_lines") if k in manifest}}))
        return 0
    if args.data_command == "synth":
        from distrec.data import synthesize

        cfg = _config_from_args(args)
        if args.rows is not None:
            cfg.data.synthetic.rows = args.rows
        if args.seed is not None:
            cfg.data.synthetic.seed = args.seed
        from distrec import config

        config.validate(cfg)
        synthesize(cfg.data.synthetic, Path(args.output), progress=not args.no_progress)
        print(json.dumps({"output": args.output, "rows": cfg.data.synthetic.rows}))
        return 0
    parser.parse_args(["data", "--help"])
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``distrec`` command; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return _train(args, argv)
        if args.command == "evaluate":
            return _evaluate(args)
        if args.command == "data":
            return _data(args, parser)
        if args.command == "report":
            return _report(args)
        parser.print_help()
        return 2
    except DistrecError as e:
        print(f"distrec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("distrec: interrupted", file=sys.stderr)
        return 130


