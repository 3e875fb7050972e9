"""``distrec plan``: shard embedding tables over devices (NeuroShard or a baseline heuristic).

``distrec plan collect`` measures this machine's micro-benchmarks and ``distrec plan
train-cost-models`` trains the cost models that ``distrec plan`` searches with. All three
use one folder by default (``distrec.planner.store``).
"""

from __future__ import annotations

import argparse
import json
import sys

from distrec.cli.args import EXAMPLES_FORMAT, add_config_args, add_data_args

EXAMPLES = """
examples:
  distrec plan calibrate --budget-minutes 15          # measure + train in one go, for 4 and 8 devices
  distrec plan collect --devices 4 8                  # micro-benchmarks (resumable), ~7 min on 2 CPU cores
  distrec plan train-cost-models                      # prints each model's test MSE
  distrec plan --tables tables.yaml --devices 4 --memory-per-device 4GB -o plan.json
  distrec plan --data day_0.gz --data-format criteo --devices 8 --memory-per-device 2GB \\
      --pin C3=0 --no-split C12 -o plan.json
  distrec plan --tables tables.yaml --devices 4 --memory-per-device 64MB --algorithm size-lookup-greedy -o plan.json
  distrec train --data day_0.gz --data-format criteo --plan plan.json ...   # train with the plan
  distrec plan --tables tables.yaml --devices 4 --memory-per-device 4GB --format torchrec -o plan.json
      # TorchRec's ParameterSharding per table, for DistributedModelParallel (docs/neuroshard-vs-torchrec.md)

A table file is a YAML/JSON list of {name, rows, dim, pooling_factor, histogram (optional:
17 reuse-factor fractions)}. Cost data and models live in $DISTREC_CACHE/planner (default
~/.cache/distrec/planner) unless --out / --cost-models say otherwise.
"""


ALGORITHMS = ("neuroshard", "random", "size-greedy", "dim-greedy", "lookup-greedy", "size-lookup-greedy", "torchrec")
"""``distrec.planner.api.ALGORITHMS``, written out: importing the planner here would load torch
for every command's start (a test keeps the two equal)."""


def register(sub: argparse._SubParsersAction) -> None:
    from distrec.parallel.torchrec_format import DEFAULT_MODULE

    p = sub.add_parser("plan", help="plan how tables are sharded over devices", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    tables = p.add_argument_group("tables (one of --tables or --data)")
    tables.add_argument("--tables", metavar="FILE", help="YAML/JSON table list")
    add_data_args(tables)
    add_config_args(tables)
    tables.add_argument("--dim", type=int, metavar="N", help="with --data: embedding dimension (default model.embedding_dim)")
    tables.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help="samples per training batch: with --data for the table statistics (default train.batch_size, else from the rows); with --algorithm torchrec for its estimates (default the cost models')",
    )
    tables.add_argument("--sample-rows", type=int, default=262_144, metavar="N", help="with --data: rows read to measure the tables")
    p.add_argument("--devices", type=int, metavar="D", help="number of devices (ranks)")
    p.add_argument("--memory-per-device", metavar="SIZE", help="table memory per device, e.g. 4GB or 512MiB")
    p.add_argument("-o", "--output", metavar="FILE", help="where to write the plan (JSON)")
    p.add_argument(
        "--format", choices=("distrec", "torchrec"), default="distrec", help="plan file format: distrec's, or TorchRec's ParameterSharding per table as JSON"
    )
    p.add_argument(
        "--torchrec-module",
        default=DEFAULT_MODULE,
        metavar="FQN",
        help=f"with --format torchrec: the EmbeddingBagCollection's path in the model (default {DEFAULT_MODULE})",
    )
    p.add_argument("--algorithm", choices=ALGORITHMS, default="neuroshard", help="planner (default neuroshard)")
    p.add_argument("--cost-models", metavar="DIR", help="folder (or .pt file) of trained cost models (default ~/.cache/distrec/planner)")
    p.add_argument("--pin", action="append", default=[], metavar="TABLE=RANK", help="put a table whole on a rank (repeatable)")
    p.add_argument("--no-split", action="append", default=[], metavar="TABLE", help="never split this table's columns (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random heuristic")
    p.set_defaults(handler=run)

    actions = p.add_subparsers(dest="plan_command", metavar="ACTION", required=False)
    collect = actions.add_parser("collect", help="measure cost micro-benchmarks on this machine", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    collect.add_argument("--devices", type=int, nargs="+", required=True, metavar="D", help="world sizes of the all-to-all benchmarks, e.g. 4 8")
    collect.add_argument("--compute-samples", type=int, default=800, metavar="N", help="lookup samples in total (default 800)")
    collect.add_argument("--comm-samples", type=int, default=250, metavar="N", help="all-to-all samples per world size (default 250)")
    _add_measurement_args(collect, "folder of costs.jsonl")
    collect.set_defaults(handler=run_collect)
    cal = actions.add_parser(
        "calibrate", help="measure micro-benchmarks within a time budget and train the cost models", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT
    )
    cal.add_argument("--budget-minutes", type=float, default=15.0, metavar="M", help="time for measuring and training (default 15)")
    cal.add_argument("--devices", type=int, nargs="+", default=[4, 8], metavar="D", help="world sizes to plan for (default 4 8)")
    _add_measurement_args(cal, "folder of costs.jsonl and cost_models.pt")
    cal.set_defaults(handler=run_calibrate)
    train = actions.add_parser("train-cost-models", help="train the cost models on collected data", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    train.add_argument("--cost-data", nargs="+", metavar="FILE", help="collected JSONL files (default DIR/costs.jsonl)")
    train.add_argument("--out", metavar="DIR", help="folder of cost_models.pt (default ~/.cache/distrec/planner)")
    train.add_argument("--epochs", type=int, default=1000, help="most epochs per model (early stopping ends sooner)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--compute-head",
        choices=("mlp", "monotone"),  # distrec.planner.cost_models.COMPUTE_HEADS, without importing torch here
        default="mlp",
        help="compute model after the per-table sum: mlp (the NeuroShard paper's, default) or monotone (additive over tables)",
    )
    train.set_defaults(handler=run_train)


def _add_measurement_args(p: argparse.ArgumentParser, out_help: str) -> None:
    """The micro-benchmark options collect and calibrate share."""
    p.add_argument("--batch-size", type=int, default=4096, metavar="B", help="samples per batch (default 4096)")
    p.add_argument("--max-dim", type=int, default=128, metavar="N", help="largest table dimension sampled (default 128)")
    p.add_argument("--device", metavar="TYPE", help="cpu or cuda (default: the accelerator if any)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="DIR", help=f"{out_help} (default ~/.cache/distrec/planner)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.errors import DistrecError
    from distrec.planner import format_report, parse_constraints, plan_tables
    from distrec.planner.store import load_cost_models
    from distrec.units import parse_bytes

    missing = [flag for flag, value in (("--devices", args.devices), ("--memory-per-device", args.memory_per_device), ("-o", args.output)) if value is None]
    if missing:
        raise DistrecError(f"distrec plan needs {', '.join(missing)}; e.g. distrec plan --tables tables.yaml --devices 4 --memory-per-device 4GB -o plan.json")
    if args.devices < 1:
        raise DistrecError(f"--devices {args.devices} must be at least 1")
    memory = parse_bytes(args.memory_per_device, "--memory-per-device")
    tables = _tables(args)
    constraints = parse_constraints(args.pin, args.no_split)
    needs_models = args.algorithm == "neuroshard" or args.cost_models is not None
    models = load_cost_models(args.cost_models) if needs_models else None
    plan, report = plan_tables(tables, args.devices, memory, models, args.algorithm, constraints, seed=args.seed, batch_size=args.batch_size)
    if args.format == "torchrec":
        from distrec.io import atomic_write_json
        from distrec.parallel.torchrec_format import torchrec_dict_from_plan
        from distrec.planner.workload import default_device

        atomic_write_json(args.output, torchrec_dict_from_plan(plan.to_dict(), args.torchrec_module, default_device().type))
    else:
        plan.save(args.output)
    print(format_report(report))
    keys = ("algorithm", "devices", "predicted_max_ms", "search_time_s", "cache_hit_rate")
    print(json.dumps({"plan": args.output, "format": args.format, **{k: report[k] for k in keys if k in report}}))
    return 0


def _tables(args: argparse.Namespace):
    """The TableSpecs of --tables or of --data."""
    from distrec.errors import DistrecError

    if (args.tables is None) == (args.data is None and args.data_format is None):
        raise DistrecError("give the tables with exactly one of --tables FILE or --data PATH --data-format F")
    if args.tables is not None:
        from distrec.planner import load_table_specs

        return load_table_specs(args.tables)
    from distrec.cli.args import config_from_args
    from distrec.config import auto_batch_size
    from distrec.data import Dataset, prepare
    from distrec.planner.data_tables import table_specs_from_dataset

    cfg = config_from_args(args)
    dataset = Dataset(prepare(cfg.data, progress=not args.no_progress), cfg.data)
    dim = args.dim or cfg.model.embedding_dim
    batch_size = cfg.train.batch_size or auto_batch_size(dataset.num_rows)
    return table_specs_from_dataset(dataset, dim, batch_size, args.sample_rows, progress=not args.no_progress)


def run_collect(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.errors import DistrecError
    from distrec.planner import run_collect as collect
    from distrec.planner.collect import check_measurement
    from distrec.planner.store import COST_DATA_FILE, planner_dir

    if min(args.devices) < 2 or min(args.compute_samples, args.comm_samples) < 0:
        raise DistrecError("collect needs --devices of at least 2 and sample counts >= 0")
    check_measurement(args.batch_size, args.devices, args.seed, args.device)  # every world size's, before the first is measured
    out = planner_dir(args.out) / COST_DATA_FILE
    for devices in args.devices:
        collect(
            out,
            args.compute_samples,
            args.comm_samples,
            devices,
            batch_size=args.batch_size,
            seed=args.seed,
            max_dim=args.max_dim,
            device=args.device,
            progress=not args.no_progress,
            log=_to_stderr,
        )
    print(json.dumps({"cost_data": str(out), "devices": args.devices, "compute_samples": args.compute_samples, "comm_samples": args.comm_samples}))
    return 0


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.planner import train_cost_models
    from distrec.planner.store import COST_DATA_FILE, cost_models_path, planner_dir

    data = args.cost_data or [planner_dir(args.out) / COST_DATA_FILE]
    out = cost_models_path(args.out)
    models = train_cost_models(data, out, seed=args.seed, epochs=args.epochs, compute_head=args.compute_head)
    warn_worse_than_the_mean(models.metrics, calibrated=False)
    print(json.dumps({"cost_models": str(out), "hardware": models.hardware, "test_mse": {k: m["test_mse"] for k, m in models.metrics.items()}}))
    return 0


def run_calibrate(args: argparse.Namespace, argv: list[str]) -> int:
    import time

    from distrec.planner.calibrate import calibrate, describe_errors
    from distrec.planner.store import COST_MODELS_FILE, planner_dir

    start = time.perf_counter()
    out = planner_dir(args.out)
    models, counts = calibrate(
        out,
        sorted(set(args.devices)),
        args.budget_minutes,
        args.batch_size,
        args.max_dim,
        args.seed,
        args.device,
        progress=not args.no_progress,
        log=lambda line: print(line, flush=True),
    )
    warn_worse_than_the_mean(models.metrics, calibrated=True)
    summary = {
        "cost_models": str(out / COST_MODELS_FILE),
        "compute_samples": counts.compute,
        "comm_samples": {str(d): n for d, n in counts.comm.items()},
        "held_out": describe_errors(models),
        "minutes": (time.perf_counter() - start) / 60,
    }
    print(json.dumps(summary))
    return 0


def _to_stderr(line: str) -> None:
    print(f"distrec: {line}", file=sys.stderr, flush=True)


def warn_worse_than_the_mean(metrics: dict[str, dict], calibrated: bool) -> None:
    """One warning line on stderr per cost model whose held-out R^2 is negative (it predicts
    worse than the mean of its test targets), saying how to get more samples: a longer
    calibration, or a larger sample count of ``plan collect``."""
    for name, m in metrics.items():
        if m["test_r2"] >= 0:
            continue
        if calibrated:
            fix = "calibrate again with a larger --budget-minutes"
        else:
            flag = "--compute-samples" if name == "compute" else "--comm-samples"
            fix = f"collect more samples ('distrec plan collect' with a larger {flag}, or 'distrec plan calibrate') and train again"
        _to_stderr(f"warning: the {name} cost model has held-out R^2 {m['test_r2']:.2f}, worse than predicting the mean; {fix}")
