"""Half-precision tables (``--table-dtype fp16`` / ``bf16``) against fp32: memory, speed, AUC.

Every measurement is ``distrec train`` in a fresh process, the dtypes in turns:

- ``memory``: a synthetic run whose tables dominate memory (``dlrm-kaggle`` with 26 tables of
  ``--table-rows`` rows x dim 64, SGD, which keeps no state, a few steps), on 1 process and
  on ``--nproc-per-node 2`` row-wise, beside the same run with ``--baseline-table-rows`` rows
  per table. Per dtype and process count: the table bytes per rank (rows x 64 x 4 or 2), the
  peak RSS per rank (``peak_rss_bytes_per_rank`` of the summary), the RSS above the small
  tables' run (``table_rss``: what the rows cost) and its ratio to fp32's;
- ``speed``: samples/s in the steady state (the batch over the breakdown's mean step time,
  warm-up steps skipped) at pooling factors 1 and 20 (26 tables of ``--speed-table-rows`` x 64,
  the run's default optimizers: Adam for the dense layers, row-wise Adagrad for the rows), in
  ``--rounds`` rounds, the systems in a rotating order; the median per system, its ratio
  to fp32's, and the median of the ratios within a round (steadier on a shared machine).
  Beside the dtypes, fp32 on the torch operators (``DISTREC_KERNELS=torch``, the path half
  tables take) separates the cost of leaving the compiled kernels from that of half rows;
- ``quality``: holdout AUC and logloss on the Criteo sample and MovieLens with the tuned
  configs (``configs/criteo-sample.yaml``; ``configs/movielens.yaml`` for
  ``--movielens-epochs`` epochs), one round per seed; per dtype the mean, and the paired
  (same seed) differences from fp32: mean, standard deviation, largest, and whether the mean
  is within ``--target`` (0.001);
- ``profile``: one worker per system trains the speed run's model at pooling factor 20 in
  its own process with distrec's training step and profiles a few steps with
  ``torch.profiler``: the operators taking the most time.

Prints a table per part; the last line is the harness's result record (one system per part,
dtype and setting) with every figure. Writes OUT/half_tables.json and (with a part besides the profile) OUT/half_tables.png.

    python benchmarks/half_tables.py                   # about 15 minutes on 2 shared cores
    python benchmarks/half_tables.py --quick           # fp32 and fp16, tiny sizes, one seed
    python benchmarks/half_tables.py --parts quality --datasets criteo --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import harness
from distrec.components.breakdown import COMPONENTS

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
DATASETS = {
    # name: (config file, data path)
    "criteo": (ROOT / "configs" / "criteo-sample.yaml", SHARED / "criteo" / "criteo_kaggle_sample.tsv"),
    "movielens": (ROOT / "configs" / "movielens.yaml", SHARED / "movielens"),
}
DTYPES = ("fp32", "fp16", "bf16")
BYTES_PER_VALUE = {"fp32": 4, "fp16": 2, "bf16": 2}
TABLES, DIM = 26, 64  # the synthetic data's tables, and the row width of the memory and speed runs
TORCH_OPERATORS = "fp32, torch operators"
PARTS = ("memory", "speed", "quality", "profile")
QUICK = {
    "parts": ["memory", "speed", "quality"],
    "dtypes": ["fp32", "fp16"],
    "procs": [1],
    "table_rows": 20_000,
    "pooling_factors": [20],
    "rounds": 1,
    "speed_table_rows": 5_000,
    "speed_steps": 7,
    "batch_size": 256,
    "torch_operators": False,
    "seeds": [0],
    "datasets": ["criteo"],
    "quality_max_steps": 20,
}


# ----------------------------------------------------------------------------- memory


def synthetic_items(table_rows: int, rows: int, pooling_factor: int = 1) -> list[str]:
    """``section.key=value`` items of the synthetic data set: 26 tables of ``table_rows`` x 64."""
    return [
        f"data.synthetic.rows={rows}",
        f"data.synthetic.table_rows={table_rows}",
        f"data.max_ind_range={table_rows}",
        f"data.synthetic.pooling_factor={pooling_factor}",
        f"model.embedding_dim={DIM}",
    ]


def train(out: Path, arguments: list[str], args: argparse.Namespace, procs: int = 1, env: dict[str, str] | None = None) -> harness.TrainedRun:
    """``distrec train`` with ``args.threads`` threads per process, its checkpoint removed afterwards (disk)."""
    run = harness.distrec_train(out, [*arguments, *harness.set_items([f"train.threads={args.threads}"])], procs, Path(args.out) / "cache", env)
    shutil.rmtree(out / "checkpoint", ignore_errors=True)
    return run


def memory_run(dtype: str, procs: int, table_rows: int, args: argparse.Namespace) -> list[int]:
    """Peak RSS (bytes) per rank of a few SGD steps on 26 tables of ``table_rows`` x 64 in ``dtype``."""
    steps, batch = args.memory_steps, 256
    arguments = ["--preset", "dlrm-kaggle", "--optimizer", "sgd", "--table-dtype", dtype, "--max-steps", str(steps), "--batch-size", str(batch)]
    arguments += harness.set_items(synthetic_items(table_rows, batch * (steps + 2)))
    if procs > 1:
        arguments += ["--sharding", "row_wise"]
    run = train(Path(args.out) / "memory" / f"{procs}p-{table_rows}-{dtype}", arguments, args, procs)
    rss = [int(b) for b in run.summary["peak_rss_bytes_per_rank"]]
    print(f"  memory {procs}p {table_rows:>9,} rows/table {dtype}: peak RSS per rank {', '.join(f'{b / 2**20:,.0f}' for b in rss)} MiB", flush=True)
    return rss


def measure_memory(args: argparse.Namespace) -> dict:
    """Per process count and dtype: table bytes, peak RSS, RSS above the small tables' run, ratio to fp32."""
    result: dict = {"table_rows": args.table_rows, "baseline_table_rows": args.baseline_table_rows, "tables": TABLES, "dim": DIM}
    for procs in args.procs:
        systems = {
            (dtype, rows): (lambda r, d=dtype, n=rows: memory_run(d, procs, n, args))
            for rows in (args.baseline_table_rows, args.table_rows)
            for dtype in args.dtypes
        }
        measured = {key: rounds[0] for key, rounds in harness.interleaved_rounds(systems, 1).items()}
        per_dtype = {}
        for dtype in args.dtypes:
            big, small = measured[(dtype, args.table_rows)], measured[(dtype, args.baseline_table_rows)]
            table_rss = [b - s for b, s in zip(big, small)]
            per_dtype[dtype] = {
                "table_bytes_per_rank": TABLES * args.table_rows * DIM * BYTES_PER_VALUE[dtype] / procs,
                "peak_rss_bytes_per_rank": big,
                "baseline_peak_rss_bytes_per_rank": small,
                "table_rss_bytes_per_rank": table_rss,
            }
        fp32_rss = statistics.fmean(per_dtype["fp32"]["table_rss_bytes_per_rank"])
        for figures in per_dtype.values():
            figures["table_rss_over_table_bytes"] = statistics.fmean(figures["table_rss_bytes_per_rank"]) / figures["table_bytes_per_rank"]
            figures["table_rss_ratio_to_fp32"] = statistics.fmean(figures["table_rss_bytes_per_rank"]) / fp32_rss
            figures["peak_rss_ratio_to_fp32"] = statistics.fmean(figures["peak_rss_bytes_per_rank"]) / statistics.fmean(
                per_dtype["fp32"]["peak_rss_bytes_per_rank"]
            )
        result[f"{procs}p"] = per_dtype
    return result


# ----------------------------------------------------------------------------- speed


def speed_systems(args: argparse.Namespace) -> dict[str, tuple[str, dict[str, str]]]:
    """System name -> (table dtype, environment): the dtypes, and fp32 on the torch operators."""
    systems = {dtype: (dtype, {}) for dtype in args.dtypes}
    if args.torch_operators:
        systems = {"fp32": systems.pop("fp32"), TORCH_OPERATORS: ("fp32", {"DISTREC_KERNELS": "torch"}), **systems}
    return systems


def speed_run(system: str, pooling_factor: int, args: argparse.Namespace, round_index: int) -> dict:
    """Steady-state samples/s and ms per component of one run at ``pooling_factor``."""
    dtype, env = speed_systems(args)[system]
    steps, batch = args.speed_steps, args.batch_size
    arguments = ["--preset", "dlrm-kaggle", "--table-dtype", dtype, "--max-steps", str(steps), "--batch-size", str(batch)]
    arguments += harness.set_items([*synthetic_items(args.speed_table_rows, int(batch * (steps + 1) / 0.99), pooling_factor), "data.split=random:0.01"])
    label = system.replace(", ", "-").replace(" ", "-")
    run = train(Path(args.out) / "speed" / f"pf{pooling_factor}-{label}-round{round_index}", arguments, args, env=env)
    step_ms = run.step_ms(COMPONENTS)
    figures = {
        "samples_per_s": batch / step_ms * 1e3,
        "step_ms": step_ms,
        "breakdown_ms": {c: round(run.breakdown["components"][c]["mean_ms"], 2) for c in COMPONENTS if run.breakdown["components"][c]["mean_ms"] > 0},
    }
    print(
        f"  speed pooling {pooling_factor:>2} {system:<22} round {round_index}: {figures['samples_per_s']:>8,.0f} samples/s  step {step_ms:7.1f} ms", flush=True
    )
    return figures


def measure_speed(args: argparse.Namespace) -> dict:
    """Per pooling factor and system: samples/s of every round, their median, its ratio to fp32, the median round's breakdown."""
    result: dict = {"table_rows": args.speed_table_rows, "batch_size": args.batch_size, "steps": args.speed_steps, "rounds": args.rounds}
    for pf in args.pooling_factors:
        systems = {name: (lambda r, name=name, pf=pf: speed_run(name, pf, args, r)) for name in speed_systems(args)}
        per_system = {}
        for name, rounds in harness.interleaved_rounds(systems, args.rounds, order="rotate").items():
            speeds = harness.Samples([r["samples_per_s"] for r in rounds])
            middle = sorted(rounds, key=lambda r: r["step_ms"])[(len(rounds) - 1) // 2]
            per_system[name] = {"samples_per_s": speeds.summary(0), "median_round_breakdown_ms": middle["breakdown_ms"]}
        fp32 = per_system["fp32"]["samples_per_s"]
        for figures in per_system.values():
            figures["ratio_to_fp32"] = round(figures["samples_per_s"]["median"] / fp32["median"], 3)
            # each round's ratio pairs runs made minutes apart, under much the same load
            figures["round_ratios_to_fp32"] = [round(v / b, 3) for v, b in zip(figures["samples_per_s"]["values"], fp32["values"], strict=True)]
            figures["median_round_ratio_to_fp32"] = statistics.median(figures["round_ratios_to_fp32"])
        result[f"pooling_{pf}"] = per_system
    return result


# ----------------------------------------------------------------------------- quality


def quality_run(name: str, dtype: str, seed: int, args: argparse.Namespace) -> dict:
    """Holdout AUC and logloss of the tuned config of data set ``name`` with ``dtype`` tables."""
    config_file, path = DATASETS[name]
    arguments = ["--config", str(config_file), "--data", str(path), "--seed", str(seed), "--table-dtype", dtype]
    if args.quality_max_steps:
        arguments += ["--max-steps", str(args.quality_max_steps)]
    elif name == "movielens":
        arguments += ["--epochs", str(args.movielens_epochs)]
    run = train(Path(args.out) / "quality" / f"{name}-{dtype}-seed{seed}", arguments, args)
    print(f"  quality {name:<9} seed {seed} {dtype}: AUC {run.summary['auc']:.4f}  logloss {run.summary['logloss']:.4f}  ({run.wall_s:.0f} s)", flush=True)
    return {"auc": run.summary["auc"], "logloss": run.summary["logloss"], "steps": run.summary["steps"]}


def paired_difference(values: list[float], baseline: list[float], target: float) -> dict:
    """Per-seed differences ``values - baseline``: their mean, standard deviation, largest magnitude, and the mean within ``target``."""
    diffs = [v - b for v, b in zip(values, baseline, strict=True)]
    mean = statistics.fmean(diffs)
    return {
        "per_seed": diffs,
        "mean": mean,
        "sd": statistics.stdev(diffs) if len(diffs) > 1 else 0.0,
        "max_abs": max(abs(d) for d in diffs),
        "within_target": abs(mean) <= target,
    }


def measure_quality(args: argparse.Namespace) -> dict:
    """Per data set and dtype: AUC and logloss per seed and their means; paired differences from fp32."""
    result: dict = {"seeds": args.seeds, "target": args.target, "movielens_epochs": args.movielens_epochs, "max_steps": args.quality_max_steps}
    for name in args.datasets:
        systems = {dtype: (lambda r, d=dtype, n=name: quality_run(n, d, args.seeds[r], args)) for dtype in args.dtypes}
        runs = harness.interleaved_rounds(systems, len(args.seeds), order="rotate")
        per_dtype = {}
        for dtype, seeds in runs.items():
            auc, logloss = [r["auc"] for r in seeds], [r["logloss"] for r in seeds]
            per_dtype[dtype] = {
                "auc": auc,
                "logloss": logloss,
                "auc_mean": statistics.fmean(auc),
                "logloss_mean": statistics.fmean(logloss),
                "steps": seeds[0]["steps"],
            }
        fp32 = per_dtype["fp32"]
        for dtype, figures in per_dtype.items():
            if dtype != "fp32":
                figures["auc_minus_fp32"] = paired_difference(figures["auc"], fp32["auc"], args.target)
                figures["logloss_minus_fp32"] = paired_difference(figures["logloss"], fp32["logloss"], args.target)
        result[name] = per_dtype
    return result


# ----------------------------------------------------------------------------- profile


def profile_worker(spec: dict) -> dict:
    """In this process: ``spec["steps"]`` training steps of the speed run's model, profiled after
    as many warm-up steps; the operators with the most self CPU time, ms per step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from distrec import config
    from distrec.components.optim import SparseRowOptimizer
    from distrec.components.optimization import Optimization
    from distrec.components.step import TrainStep
    from distrec.data import Dataset, prepare
    from distrec.models.build import build_model

    steps, batch = spec["steps"], spec["batch_size"]
    items = [*synthetic_items(spec["table_rows"], batch * (2 * steps + 1), spec["pooling_factor"]), f"model.table_dtype={spec['dtype']}"]
    cfg = config.load(None, [*items, f"data.cache_dir={spec['cache_dir']}", "train.seed=0"], preset="dlrm-kaggle")
    torch.set_num_threads(spec["threads"])
    dataset = Dataset(prepare(cfg.data, progress=False), cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg.model, dataset.num_dense, dataset.tables(DIM))
    optimizers = Optimization.of(cfg.train, 2 * steps).optimizers(model)
    for optimizer in optimizers:
        if isinstance(optimizer, SparseRowOptimizer):
            optimizer.update_in_backward()  # as the trainer does (float32 CPU rows only)
    step = TrainStep(model, optimizers)
    batches = list(dataset.batches(dataset.split("random:0.01")["train"], batch, shuffle=True, seed=0))[: 2 * steps]
    for b in batches[:steps]:
        step(b)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches[steps:]:
            step(b)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_us = sum(e.self_cpu_time_total for e in events)
    top = [{"op": e.key, "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps, "share": e.self_cpu_time_total / total_us} for e in events[: spec["top"]]]
    return {"ms_per_step": total_us / 1e3 / steps, "top": top}


def measure_profile(args: argparse.Namespace) -> dict:
    """Per system, the profile of a few steps at pooling factor 20 (``profile_worker`` in a fresh process)."""
    result: dict = {"pooling_factor": 20, "table_rows": args.speed_table_rows, "batch_size": args.batch_size}
    for name, (dtype, env) in speed_systems(args).items():
        spec = {
            "dtype": dtype,
            "pooling_factor": 20,
            "table_rows": args.speed_table_rows,
            "batch_size": args.batch_size,
            "steps": 3,
            "threads": args.threads,
            "top": 8,
            "cache_dir": str(Path(args.out) / "cache"),
        }
        result[name] = harness.run_worker(__file__, spec, env)
        ops = ", ".join(f"{t['op']} {t['self_ms_per_step']:.0f}" for t in result[name]["top"][:5])
        print(f"  profile {name:<22} {result[name]['ms_per_step']:7.1f} ms/step: {ops}", flush=True)
    return result


# ----------------------------------------------------------------------------- report


def print_tables(results: dict, args: argparse.Namespace) -> None:
    if "memory" in results:
        print(
            f"\n{'memory':<10} {'dtype':<6} {'table MiB/rank':>14} {'peak RSS MiB/rank':>18} {'small-table RSS':>15} {'RSS of rows':>11} {'ratio to fp32':>13}"
        )
        for procs in args.procs:
            for dtype, m in results["memory"][f"{procs}p"].items():
                mib = lambda b: statistics.fmean(b) / 2**20  # noqa: E731
                print(
                    f"{procs}p{'':<8} {dtype:<6} {m['table_bytes_per_rank'] / 2**20:>14,.0f} {mib(m['peak_rss_bytes_per_rank']):>18,.0f} "
                    f"{mib(m['baseline_peak_rss_bytes_per_rank']):>15,.0f} {mib(m['table_rss_bytes_per_rank']):>11,.0f} {m['table_rss_ratio_to_fp32']:>13.3f}"
                )
    if "speed" in results:
        print(f"\n{'speed':<12} {'system':<22} {'samples/s':>10} {'p90/p10':>8} {'ratio to fp32':>13} {'median of round ratios':>22}")
        for pf in args.pooling_factors:
            for name, s in results["speed"][f"pooling_{pf}"].items():
                print(
                    f"pooling {pf:<4} {name:<22} {s['samples_per_s']['median']:>10,.0f} {s['samples_per_s']['p90_over_p10']:>8.2f} {s['ratio_to_fp32']:>13.3f} {s['median_round_ratio_to_fp32']:>22.3f}"
                )
    if "quality" in results:
        print(f"\n{'quality':<10} {'dtype':<6} {'AUC mean':>9} {'AUC - fp32 (paired)':>22} {'max |diff|':>10} {'logloss - fp32':>15}")
        for name in args.datasets:
            for dtype, q in results["quality"][name].items():
                d = q.get("auc_minus_fp32")
                paired = f"{d['mean']:+.5f} +- {d['sd']:.5f}" if d else "-"
                worst = f"{d['max_abs']:.5f}" if d else "-"
                loss = f"{q['logloss_minus_fp32']['mean']:+.5f}" if d else "-"
                print(f"{name:<10} {dtype:<6} {q['auc_mean']:>9.4f} {paired:>22} {worst:>10} {loss:>15}")


def plot(results: dict, args: argparse.Namespace, path: Path) -> None:
    """Panels: RSS of the rows per rank (memory), samples/s (speed), paired AUC differences from fp32 (quality)."""
    parts = [p for p in ("memory", "speed", "quality") if p in results]
    fig, axes = harness.figure(len(parts), width=5.5)
    for ax, part in zip(axes, parts):
        if part == "memory":
            categories = [f"{p} process{'es' if p > 1 else ''}" for p in args.procs]
            series = {d: [statistics.fmean(results["memory"][f"{p}p"][d]["table_rss_bytes_per_rank"]) / 2**20 for p in args.procs] for d in args.dtypes}
            harness.bars(ax, categories, series, "peak RSS above the small-table run, MiB per rank")
            ax.set_title(f"memory: {TABLES} tables x {args.table_rows:,} rows x {DIM}")
        elif part == "speed":
            names = list(speed_systems(args))
            series = {n: [results["speed"][f"pooling_{pf}"][n]["samples_per_s"]["median"] for pf in args.pooling_factors] for n in names}
            harness.bars(ax, [f"pooling factor {pf}" for pf in args.pooling_factors], series, "samples/s (median of rounds)")
            ax.set_title("speed, 1 process")
        else:
            halves = [d for d in args.dtypes if d != "fp32"]
            series = {d: [results["quality"][n][d]["auc_minus_fp32"]["mean"] for n in args.datasets] for d in halves}
            errors = {d: [results["quality"][n][d]["auc_minus_fp32"]["sd"] for n in args.datasets] for d in halves}
            harness.bars(ax, args.datasets, series, "AUC - fp32's AUC (mean of seeds, paired)", errors)
            for y in (-args.target, args.target):
                ax.axhline(y, color="grey", linestyle="--", linewidth=1)
            ax.set_title(f"quality: {len(args.seeds)} seed(s), dashed: +-{args.target}")
    harness.save_png(fig, path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES), help="fp32 is the baseline and always runs")
    parser.add_argument("--quick", action="store_true", help=f"tiny sizes, one round and seed, fp32 and fp16 (options given still win): {QUICK}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training process (default 1)")
    parser.add_argument("--out", default="runs/half_tables", help="where runs, half_tables.json and half_tables.png go")
    memory = parser.add_argument_group("memory")
    memory.add_argument("--procs", nargs="+", type=int, default=[1, 2], help="process counts (default 1 2; several: row-wise sharding)")
    memory.add_argument("--table-rows", type=int, default=100_000, help="rows per table of the memory run (26 tables x 64)")
    memory.add_argument("--baseline-table-rows", type=int, default=1_000, help="rows per table of the run whose RSS is subtracted")
    memory.add_argument("--memory-steps", type=int, default=4)
    speed = parser.add_argument_group("speed")
    speed.add_argument("--pooling-factors", nargs="+", type=int, default=[1, 20])
    speed.add_argument("--rounds", type=int, default=3)
    speed.add_argument("--speed-table-rows", type=int, default=50_000, help="rows per table of the speed runs (26 tables x 64)")
    speed.add_argument("--speed-steps", type=int, default=12, help="steps per speed run; the breakdown skips the first 5")
    speed.add_argument("--batch-size", type=int, default=1024)
    speed.add_argument("--torch-operators", action=argparse.BooleanOptionalAction, default=True, help="also fp32 on the torch operators")
    quality = parser.add_argument_group("quality")
    quality.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    quality.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    quality.add_argument("--movielens-epochs", type=int, default=1, help="epochs of the MovieLens config (its own: 3)")
    quality.add_argument("--quality-max-steps", type=int, default=0, help="N > 0: N steps per quality run instead of the configs' length")
    quality.add_argument("--target", type=float, default=0.001, help="largest |mean paired AUC difference| from fp32 that meets the target")
    if "--quick" in argv:
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    args.dtypes = ["fp32", *[d for d in args.dtypes if d != "fp32"]]
    if "speed" in args.parts and args.speed_steps <= 5:
        parser.error("--speed-steps must be more than 5: the breakdown skips the first 5 steps")
    return args


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == harness.WORKER_FLAG:
        print(json.dumps(profile_worker(json.loads(sys.argv[2]))))
        return
    args = parse_args(sys.argv[1:])
    out = Path(args.out)
    measure = {"memory": measure_memory, "speed": measure_speed, "quality": measure_quality, "profile": measure_profile}
    results = {part: measure[part](args) for part in PARTS if part in args.parts}
    print_tables(results, args)
    if {"memory", "speed", "quality"} & set(results):
        plot(results, args, out / "half_tables.png")
    systems = []
    if "memory" in results:
        for procs in args.procs:
            for dtype, m in results["memory"][f"{procs}p"].items():
                systems.append(
                    harness.SystemResult(f"memory {procs}p {dtype}", "RSS of the rows per rank", "bytes", harness.Samples(m["table_rss_bytes_per_rank"]))
                )
    if "speed" in results:
        for pf in args.pooling_factors:
            for name, s in results["speed"][f"pooling_{pf}"].items():
                systems.append(harness.SystemResult(f"speed pooling {pf} {name}", "throughput", "samples/s", harness.Samples(s["samples_per_s"]["values"])))
    if "quality" in results:
        for name in args.datasets:
            for dtype, q in results["quality"][name].items():
                systems.append(harness.SystemResult(f"quality {name} {dtype}", "holdout AUC", "AUC", harness.Samples(q["auc"])))
    extra = {"config": vars(args), **results}
    harness.finish(harness.ResultRecord("half_tables", systems, None, extra), out / "half_tables.json")


if __name__ == "__main__":
    main()
