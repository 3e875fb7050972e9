"""``distrec bench hotline``: what Hotline gains on a data set, with a PNG curve and JSON."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT, add_config_args, add_data_args, config_from_args
from distrec.errors import DistrecError

EXAMPLES = """
examples:
  distrec bench hotline --out runs/hotline-synthetic             # synthetic Zipf(1.05) data
  distrec bench hotline --data-format criteo --data ../shared/data/criteo/criteo_kaggle_sample.tsv \\
      --batch-size 32 --out runs/hotline-criteo
  distrec bench hotline --data-format movielens --data ../shared/data/movielens --batch-size 256 \\
      --budgets 16KB,64KB,256KB,1MB --sample-rates 0.05,0.25,1 --out runs/hotline-movielens

It writes hotline-popularity.png (popular inputs and lookups served hot versus the hot
budget), hotline-recall.png (the access logger's recall of the top rows versus its memory
and sample rate) and hotline-bench.json (every figure) into --out, and prints a summary as
one JSON line: the fractions at the hot budget, the recall and the throughputs.
"""

DEFAULT_BUDGET_POINTS = 12  # budgets from 1/1000 of the rows the stream touches to all of them, log-spaced
DEFAULT_SAMPLE_RATES = (0.01, 0.05, 0.25, 1.0)
LOGGER_SIZE_FACTORS = (1 / 16, 1 / 4, 1, 4)  # logger memory relative to logger_bytes_for(top k)


def _list(parse):
    return lambda text: [parse(x) for x in text.split(",") if x.strip()]


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="measure a part of distrec on a data set", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    bench.set_defaults(handler=lambda args, argv: bench.print_help() or 2)
    parts = bench.add_subparsers(dest="bench_command", metavar="PART")
    hotline = parts.add_parser(
        "hotline",
        help="Hotline: popular inputs vs hot budget, logger recall, training throughput",
        epilog=EXAMPLES,
        formatter_class=EXAMPLES_FORMAT,
    )
    add_config_args(hotline)
    add_data_args(hotline)
    hotline.add_argument("--batch-size", type=int, metavar="B", help="mini-batch size in samples (default train.batch_size, else from the training rows)")
    hotline.add_argument("--max-ind-range", type=int, metavar="ROWS", help="rows per hashed table (default 100000)")
    hotline.add_argument("--batches", type=int, default=200, metavar="N", help="mini-batches of the training split to stream (default 200)")
    hotline.add_argument(
        "--budgets", type=_list(str), metavar="SIZES", help="hot budgets, e.g. 1MB,4MB,16MB (default: 1/1000 of the rows seen to all, log-spaced)"
    )
    hotline.add_argument("--hot-budget", metavar="SIZE", help="the budget the recall and throughput runs use (default hotline.hot_budget)")
    hotline.add_argument(
        "--sample-rates", type=_list(float), default=list(DEFAULT_SAMPLE_RATES), metavar="X,Y", help="logger sample rates for the recall sweep"
    )
    hotline.add_argument("--top-k", type=int, metavar="K", help="rows whose recall is measured (default: the hot budget's rows, at most 1/10 of the rows seen)")
    hotline.add_argument(
        "--train-steps",
        type=int,
        default=30,
        metavar="N",
        help="timed steps of the throughput comparison (Hotline learns on as many before), 0 to skip (default 30)",
    )
    hotline.add_argument("--out", metavar="DIR", default="runs/bench-hotline", help="folder for the PNGs and JSON (default runs/bench-hotline)")
    hotline.set_defaults(handler=run_hotline)


def _throughput(cfg, dataset, tables, rows, steps: int, out: Path) -> dict:
    """Samples/s of ordinary training and of HotlineTraining on the same ``steps`` mini-batches.

    Hotline first learns on as many other mini-batches (its relearn interval is set to
    that), so the timed steps run with a hot set.
    """
    import torch

    from distrec.components.optimization import Optimization
    from distrec.components.step import TrainStep
    from distrec.hotline.training import HotlineTraining
    from distrec.models.build import build_model

    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    stream = list(dataset.batches(rows, t.batch_size, shuffle=True, seed=t.seed))
    if len(stream) < 2 * steps:
        raise DistrecError(f"the throughput run needs {2 * steps} mini-batches, the training split has {len(stream)}; lower --train-steps")
    learn, timed = stream[:steps], stream[steps : 2 * steps]

    def samples_per_s(step) -> float:
        step(learn[0])  # warm-up (first-call allocations), untimed
        started = time.perf_counter()
        for batch in timed:
            step(batch)
        return sum(b.batch_size for b in timed) / (time.perf_counter() - started)

    torch.manual_seed(t.seed)
    model = build_model(cfg.model, dataset.num_dense, tables)
    ordinary = samples_per_s(TrainStep(model, Optimization.of(t, steps).optimizers(model)))
    torch.manual_seed(t.seed)
    model = build_model(cfg.model, dataset.num_dense, tables)
    cfg.hotline.relearn_every = steps
    with HotlineTraining(model, cfg, 2 * steps, out) as hotline:
        for batch in learn:
            hotline.step(batch)
        hot = samples_per_s(hotline.step)
        stats = hotline.stats()
    return {"steps": steps, "ordinary_samples_per_s": ordinary, "hotline_samples_per_s": hot, "hotline": stats}


def run_hotline(args: argparse.Namespace, argv: list[str]) -> int:
    import numpy as np

    from distrec.config import auto_batch_size, embedding_optimizer
    from distrec.data import Dataset, prepare
    from distrec.hotline.access_logger import DEFAULT_LOGGER_BYTES, AccessLogger, logger_bytes_for, measure_recall
    from distrec.hotline.hot_set import hot_row_bytes
    from distrec.hotline.measure import batch_ids, default_top_k, plot_popularity, plot_recall, popularity_curve
    from distrec.hotline.row_state import row_state_floats
    from distrec.hotline.rows import RowSpace
    from distrec.io import atomic_write_json
    from distrec.table_dtype import torch_dtype
    from distrec.units import parse_bytes

    cfg = config_from_args(args)
    if args.batches < 1 or args.train_steps < 0:
        raise DistrecError("--batches must be at least 1 and --train-steps 0 or more")
    if not args.sample_rates or not all(0 < r <= 1 for r in args.sample_rates):
        raise DistrecError("--sample-rates must be fractions in (0, 1], e.g. 0.05,0.25,1")
    if args.top_k is not None and args.top_k < 1:
        raise DistrecError(f"--top-k {args.top_k} asks for no rows; give at least 1")
    out = Path(args.out)
    dataset = Dataset(prepare(cfg.data, progress=not args.no_progress), cfg.data)
    rows = dataset.split(cfg.data.split, seed=cfg.train.seed)["train"]
    if cfg.train.batch_size is None:
        cfg.train.batch_size = auto_batch_size(len(rows))
    tables = dataset.tables(cfg.model.embedding_dim)
    space = RowSpace.from_tables(tables)
    dim = cfg.model.embedding_dim
    row_bytes = hot_row_bytes(dim, row_state_floats(embedding_optimizer(cfg), dim), torch_dtype(cfg.model.table_dtype).itemsize)
    table_bytes = space.total_rows * row_bytes
    hot_budget = parse_bytes(cfg.hotline.hot_budget, "hotline.hot_budget")
    if hot_budget < row_bytes:
        raise DistrecError(
            f"a hot budget of {hot_budget} bytes (--hot-budget, hotline.hot_budget) holds no row of {row_bytes} bytes; give --hot-budget {row_bytes}B or more, e.g. 1MB"
        )
    h = cfg.hotline
    stream = list(dataset.batches(rows, cfg.train.batch_size, shuffle=True, seed=cfg.train.seed))[: args.batches]
    if not stream:
        raise DistrecError("the training split has no mini-batch; use more data or a smaller --batch-size")
    ids = batch_ids(stream, space)
    if args.budgets:
        budgets = [parse_bytes(b, "--budgets") for b in args.budgets]
    else:
        seen_bytes = np.unique(np.concatenate(ids)).size * row_bytes  # beyond it every input is popular
        budgets = [int(b) for b in np.geomspace(max(row_bytes, seen_bytes / 1000), seen_bytes, DEFAULT_BUDGET_POINTS)]
    budgets = sorted({*budgets, hot_budget})
    hot_rows = min(hot_budget // row_bytes, space.total_rows)
    logger_bytes = parse_bytes(h.logger_size, "hotline.logger_size") if h.logger_size else DEFAULT_LOGGER_BYTES
    logger = AccessLogger(logger_bytes, h.sample_rate, seed=cfg.train.seed, total_rows=space.total_rows)
    curve = popularity_curve(stream, space, row_bytes, budgets, logger)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{cfg.data.format}: {len(stream)} batches of {cfg.train.batch_size}, logger sample rate {h.sample_rate:g}"
    plot_popularity(curve, out / "hotline-popularity.png", title)

    k = args.top_k or default_top_k(ids, hot_rows)
    smallest = logger_bytes_for(1)  # a logger of fewer bytes holds no set of entries
    capacities = sorted({logger_bytes, *(max(smallest, int(logger_bytes_for(k) * f)) for f in LOGGER_SIZE_FACTORS)})
    recall = measure_recall(ids, space.total_rows, [k], capacities, args.sample_rates, seed=cfg.train.seed)
    plot_recall(recall, out / "hotline-recall.png", f"{cfg.data.format}: access logger recall", {"default": logger.nbytes})

    result = {
        "data": cfg.data.format if cfg.data.path is None else f"{cfg.data.format}:{cfg.data.path}",
        "tables": len(tables),
        "table_rows": space.total_rows,
        "hot_row_bytes": row_bytes,
        "table_bytes": table_bytes,
        "hot_budget_bytes": hot_budget,
        "popular_fraction_at_hot_budget": curve["exact"]["popular_fraction"][budgets.index(hot_budget)],
        "hot_lookup_fraction_at_hot_budget": curve["exact"]["hot_lookup_fraction"][budgets.index(hot_budget)],
        "popularity": curve,
        "recall_top_k": k,
        "logger_bytes": logger_bytes,
        "recall": recall,
    }
    if args.train_steps:
        result["throughput"] = _throughput(cfg, dataset, tables, rows, args.train_steps, out)
    atomic_write_json(out / "hotline-bench.json", result)
    print(json.dumps(summary(result, out / "hotline-bench.json")))
    return 0


SUMMARY_KEYS = ("data", "table_rows", "hot_budget_bytes", "popular_fraction_at_hot_budget", "hot_lookup_fraction_at_hot_budget", "recall_top_k")


def summary(result: dict, path: Path) -> dict:
    """The few figures of a ``bench hotline`` result that the command prints, with the path
    of the file holding all of them: the popular and hot-lookup fractions at the hot budget,
    the recall of the top rows by a logger of the run's size at each sample rate and, when
    measured, both throughputs."""
    recall = {str(r["sample_rate"]): r["recall"] for r in result["recall"] if r["capacity_bytes"] == result["logger_bytes"]}
    brief = {"result": str(path), **{k: result[k] for k in SUMMARY_KEYS}, "logger_bytes": result["logger_bytes"], "recall_by_sample_rate": recall}
    if "throughput" in result:
        t = result["throughput"]
        brief.update(ordinary_samples_per_s=t["ordinary_samples_per_s"], hotline_samples_per_s=t["hotline_samples_per_s"])
    return brief
