"""NeuroShard against the sharding heuristics, with every plan executed (the paper's Table 1).

For each (devices, max dimension) setting, sharding tasks are drawn from the synthetic
DLRM table pool (``distrec.planner.table_pool``: 4 devices take 10-60 tables, 8 devices
20-120, dims max_dim, max_dim/2, ... >= 4, a scaled 4 GB per device). Every algorithm plans
every task (TorchRec's planner too, where the torchrec extra is installed); a plan that
does not fit the memory is a failure. Each plan is then *executed*
(``distrec.planner.execute``): the real embedding lookups with their backward and update on
every rank, and the real forward/backward all-to-alls of the pooled outputs across D gloo
processes (NCCL on GPUs). A plan's cost is the maximum over devices of compute + all-to-alls.
On the CPU (2 cores shared by D processes and by other users) a device's compute is the
minimum over 8 rounds of its thread CPU time, each rank alone in turn, the plans of a task
taking turns within a round (with 3 rounds the same plans' costs moved between runs by
7-11 ms on average, almost all of it compute; with 8 by 2-3 ms); and the timed steps of
all plans of a setting take turns (one step of every plan per round; the median over
rounds), so load from other jobs falls on every algorithm alike (see
``distrec.planner.execute``). Variants that produce the same plan of a task are executed
once and share its cost.

TorchRec's planner (``EmbeddingShardingPlanner``, see ``distrec.planner.torchrec_planner``)
plans the same tasks with the same per-device memory and the benchmark's batch size; its
own storage estimate (weights plus input/output buffers) may refuse tasks whose weights fit,
which counts against its success rate. Run it in a venv with TorchRec
(``benchmarks/setup_torchrec.sh``); without one it is left out and its fields are null.

The results JSON also holds, per setting, every executed plan's per-device executed and
predicted parts (compute, forward all-to-all with its wait for late ranks, backward
all-to-all). Printed per setting: each algorithm's mean cost over the tasks it solved and its success
rate; NeuroShard's mean cost over the tasks both solved divided by each baseline's
(``ratio``, below 1 means NeuroShard is faster; ``best_baseline`` is the heuristic with the
highest ratio, ``best_baseline_ms`` and ``neuroshard_ms_same_tasks`` its and NeuroShard's
means on their shared tasks; TorchRec's planner is reported on its own: ``torchrec_ms``,
``torchrec_success``, ``ratio_vs_torchrec``); each planner's mean planning time
(``planning_s``, over the tasks it solved); the cost the cost models predicted for NeuroShard's plans
against the executed cost (the paper's Fig. 8 left, saved as a PNG), and per planner the mean
executed / predicted cost of its plans (``executed_over_predicted``: a search on the models
picks plans they are optimistic about); and the ablations (no
column splits beyond those a table needs to fit a device, which is the paper's "no beam
search" of its Table 3;
beam width 1; no grid search; no cache: executed cost and search time). With
``--mlp-head-models`` (models trained on the same data with the paper's post-sum MLP compute
head), NeuroShard also plans with those, and its plans are executed in the same rounds
(``mlp_head_ratio``: their mean cost over the default head's, on the tasks both solved).

The cost models come from ``--cost-models``, or are collected and trained into ``--out``
first (resumable). ``--quick`` runs 2 max dims x 5 tasks (or ``--tasks``) per device count
and the no-cache ablation (which changes the search time, never the plan) on the
first 2 tasks of a setting; its column is the search-time ratio on those tasks.

Usage:
    python benchmarks/sharding.py --quick
    PYTHONPATH=src venv-torchrec/bin/python benchmarks/sharding.py --quick --tasks 20 --seed 1   # with TorchRec's planner
    python benchmarks/sharding.py --cost-models runs/cost_models.pt --tasks 100 --max-dims 4 8 16 32 64 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import harness
from distrec.errors import DistrecError
from distrec.planner.api import plan_tables
from distrec.planner.collect import run_collect
from distrec.planner.cost_models import CostModels, train_cost_models
from distrec.planner.execute import execute_plans
from distrec.planner.heuristics import HEURISTICS
from distrec.planner.search import SearchOptions
from distrec.planner.store import load_cost_models
from distrec.planner.table_pool import generate_tasks, make_table_pool
from distrec.planner.torchrec_planner import torchrec_available, torchrec_version

ABLATIONS = ("no-split", "no-beam", "no-grid", "no-cache")
BASELINES = (*HEURISTICS, "torchrec") if torchrec_available() else HEURISTICS  # TorchRec's planner where it is installed
VARIANTS = ("neuroshard", *BASELINES, *(f"neuroshard-{a}" for a in ABLATIONS))
MLP_HEAD = "neuroshard-mlp-head"  # NeuroShard with the paper's post-sum MLP compute head (--mlp-head-models)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 tasks, max dims 16 and 128, fewer cost samples")
    p.add_argument("--tasks", type=int, default=None, help="tasks per setting (default 100, with --quick 5)")
    p.add_argument("--devices", type=int, nargs="+", default=[4, 8])
    p.add_argument("--max-dims", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128])
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=8, help="timed compute rounds, each running every plan of a task once per device (after one warm-up round)")
    p.add_argument("--steps", type=int, default=9, help="timed training steps per plan, whose median is its cost (after one warm-up step)")
    p.add_argument(
        "--cost-models",
        type=Path,
        help="trained cost models (a folder such as ~/.cache/distrec/planner, or a .pt file); collected and trained into --out if absent",
    )
    p.add_argument("--compute-samples", type=int, default=2000)
    p.add_argument("--comm-samples", type=int, default=500)
    p.add_argument("--out", type=Path, default=Path("runs/sharding"), help="folder for cost data, models, results, figure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mlp-head-models",
        type=Path,
        help="cost models trained on the same data with 'distrec plan train-cost-models --compute-head mlp': adds NeuroShard with the paper's compute head, executed beside the default's",
    )
    p.add_argument(
        "--cache-ablation-tasks", type=int, default=None, help="plan the no-cache ablation (search time only) for the first N tasks of a setting (default all)"
    )
    args = p.parse_args()
    if args.quick:
        args.max_dims, args.compute_samples, args.comm_samples = [16, 128], 600, 200
        args.tasks = 5 if args.tasks is None else args.tasks
        args.cache_ablation_tasks = 2 if args.cache_ablation_tasks is None else args.cache_ablation_tasks
    args.tasks = 100 if args.tasks is None else args.tasks
    if args.cache_ablation_tasks is None:
        args.cache_ablation_tasks = args.tasks
    args.variants = (*VARIANTS, MLP_HEAD) if args.mlp_head_models else VARIANTS
    return args


def cost_models(args: argparse.Namespace) -> dict[str, CostModels]:
    """Load the given models, or collect micro-benchmarks and train them into ``--out``; with
    ``--mlp-head-models`` also those, under ``MLP_HEAD``."""
    if args.cost_models is not None:
        models = load_cost_models(args.cost_models)
    else:
        data = args.out / "costs.jsonl"
        for devices in args.devices:
            run_collect(data, args.compute_samples, args.comm_samples, devices, batch_size=args.batch_size, seed=args.seed)
        models = train_cost_models(data, args.out / "cost_models.pt", seed=args.seed)
    if models.batch_size != args.batch_size:
        sys.exit(f"the cost models were measured with batch size {models.batch_size}; run with --batch-size {models.batch_size}")
    if args.mlp_head_models is None:
        return {"neuroshard": models}
    head = load_cost_models(args.mlp_head_models)
    if head.compute.members[0].head_kind != "mlp" or head.batch_size != models.batch_size:
        sys.exit(f"{args.mlp_head_models} must hold models trained with --compute-head mlp on the data of --cost-models")
    return {"neuroshard": models, MLP_HEAD: head}


def plan_task(task, models: dict[str, CostModels], variants: tuple[str, ...], seed: int, with_no_cache: bool = True) -> dict[str, dict]:
    """Every variant's plan of one task: {"plan", "report"} or {"error"} (the no-cache ablation,
    which only changes the search time, is left out unless ``with_no_cache``). The variant
    ``MLP_HEAD`` plans with ``models[MLP_HEAD]``, every other with ``models["neuroshard"]``."""
    out = {}
    for variant in variants if with_no_cache else [v for v in variants if v != "neuroshard-no-cache"]:
        if variant == MLP_HEAD:
            algorithm, ablation = "neuroshard", ""
        elif variant.startswith("neuroshard"):
            algorithm, _, ablation = variant.partition("-")
        else:
            algorithm, ablation = variant, ""
        options = SearchOptions.ablation(ablation) if ablation else None
        chosen = models.get(variant, models["neuroshard"])
        try:
            plan, report = plan_tables(task.tables, task.num_devices, task.memory_per_device, chosen, algorithm, seed=seed, options=options)
            out[variant] = {"plan": plan, "report": report}
        except DistrecError as e:
            out[variant] = {"error": str(e)}
    return out


def run_setting(devices: int, max_dim: int, args, models: dict[str, CostModels], pool) -> tuple[dict, list[tuple[float, float]]]:
    """Plan and execute every task of one setting; return its summary and (predicted, real) pairs."""
    tasks = generate_tasks(pool, args.tasks, devices, max_dim, seed=args.seed * 1000 + devices * 200 + max_dim)
    planned = [
        plan_task(t, models, args.variants, args.seed + i, i < args.cache_ablation_tasks)
        for i, t in enumerate(tqdm(tasks, desc=f"planning D={devices} max_dim={max_dim}", disable=not sys.stderr.isatty()))
    ]
    for i in range(len(tasks)):  # the cache changes search time, never the plan
        if "plan" in planned[i].get("neuroshard-no-cache", {}):
            assert planned[i]["neuroshard-no-cache"]["plan"].to_dict() == planned[i]["neuroshard"]["plan"].to_dict()
    jobs, job_number, job_of = [], {}, {}  # distinct plans of each task; (task, variant) -> its job
    for i in range(len(tasks)):
        for v in args.variants:
            if "plan" in planned[i].get(v, {}):
                plan = planned[i][v]["plan"]
                key = (i, json.dumps(plan.to_dict(), sort_keys=True))
                if key not in job_number:
                    job_number[key] = len(jobs)
                    jobs.append((plan, tasks[i].tables))
                job_of[(i, v)] = job_number[key]
    costs = execute_plans(jobs, args.batch_size, warmup=1, repeats=args.repeats, seed=args.seed, progress=True, step_repeats=args.steps)
    real = {key: max(costs[job]["total"]) for key, job in job_of.items()}
    solved = {v: [i for i in range(len(tasks)) if (i, v) in real] for v in args.variants}

    def mean_cost(variant: str, on: list[int]) -> float | None:
        return statistics.fmean(real[(i, variant)] for i in on) if on else None

    attempted = {v: sum(v in p for p in planned) for v in args.variants}
    algorithms = {
        v: {
            "mean_ms": mean_cost(v, solved[v]),
            "task_ms": [real[(i, v)] for i in solved[v]],
            "success": len(solved[v]) / attempted[v] if attempted[v] else None,
            "search_time_s": statistics.fmean(planned[i][v]["report"]["search_time_s"] for i in solved[v]) if solved[v] else None,
        }
        for v in args.variants
    }
    shared = {b: [i for i in solved[b] if i in set(solved["neuroshard"])] for b in BASELINES}
    for b in BASELINES:  # NeuroShard over the baseline on the tasks both solved
        algorithms[b]["ratio"] = mean_cost("neuroshard", shared[b]) / mean_cost(b, shared[b]) if shared[b] else None
    rated = [b for b in HEURISTICS if algorithms[b]["ratio"] is not None]
    strongest = max(rated, key=lambda b: algorithms[b]["ratio"]) if rated else None  # the heuristic hardest to beat
    torchrec = algorithms.get("torchrec", {})
    head_shared = [i for i in solved.get(MLP_HEAD, []) if i in set(solved["neuroshard"])]
    pairs = [(planned[i]["neuroshard"]["report"]["predicted_max_ms"], real[(i, "neuroshard")]) for i in solved["neuroshard"]]
    details = plan_details(jobs, job_of, costs, planned)
    summary = {
        "devices": devices,
        "max_dim": max_dim,
        "tasks": len(tasks),
        "neuroshard_ms": algorithms["neuroshard"]["mean_ms"],
        "neuroshard_success": algorithms["neuroshard"]["success"],
        "best_baseline": strongest,
        "best_baseline_ms": mean_cost(strongest, shared[strongest]) if strongest else None,
        "neuroshard_ms_same_tasks": mean_cost("neuroshard", shared[strongest]) if strongest else None,
        "ratio_vs_best_baseline": algorithms[strongest]["ratio"] if strongest else None,
        "torchrec_ms": torchrec.get("mean_ms"),
        "torchrec_success": torchrec.get("success"),
        "ratio_vs_torchrec": torchrec.get("ratio"),
        "mlp_head_ratio": mean_cost(MLP_HEAD, head_shared) / mean_cost("neuroshard", head_shared) if head_shared else None,
        "planning_s": {v: algorithms[v]["search_time_s"] for v in VARIANTS[: 1 + len(BASELINES)]},
        "neuroshard_predicted_ms": statistics.fmean(p for p, _ in pairs) if pairs else None,
        "cache_hit_rate": statistics.fmean(planned[i]["neuroshard"]["report"]["cache_hit_rate"] for i in solved["neuroshard"]) if pairs else None,
        "cache_speedup": search_time_ratio(planned, "neuroshard-no-cache", "neuroshard"),
        "pairs_ordered_as_executed": pairs_ordered_as_executed(details),
        "executed_over_predicted": executed_over_predicted(details, args.variants[: 1 + len(BASELINES)]),
        "algorithms": algorithms,
        "plans": details,
    }
    return summary, pairs


def plan_details(jobs: list, job_of: dict[tuple[int, str], int], costs: list[dict], planned: list[dict]) -> list[dict]:
    """Every executed plan: its task, the variants that produced it, and per device its
    executed and predicted ms by part (compute, forward and backward all-to-all, total), as
    the default cost models predict it (none for a plan only ``MLP_HEAD`` made)."""
    variants: list[list[tuple[int, str]]] = [[] for _ in jobs]
    for key, job in job_of.items():
        variants[job].append(key)
    details = []
    for job, keys in enumerate(variants):
        by_default = [(i, v) for i, v in keys if v != MLP_HEAD]
        predicted = planned[by_default[0][0]][by_default[0][1]]["report"].get("predicted_ms") if by_default else None
        details.append({"task": keys[0][0], "variants": [v for _, v in keys], "executed_ms": costs[job], "predicted_ms": predicted})
    return details


def pairs_ordered_as_executed(plans: list[dict], tie: float = 0.02) -> float | None:
    """Of the pairs of one task's executed plans whose costs differ by more than ``tie``
    (relative), the fraction the cost models' predicted costs order the same way: how well
    the models rank the plans a search chooses between (1 = always right, 0.5 = a coin)."""
    by_task: dict[int, list[tuple[float, float]]] = {}
    for p in plans:
        if p["predicted_ms"] is not None:
            by_task.setdefault(p["task"], []).append((max(p["predicted_ms"]["total"]), max(p["executed_ms"]["total"])))
    agree = []
    for costs in by_task.values():
        for i, (pred_a, real_a) in enumerate(costs):
            for pred_b, real_b in costs[i + 1 :]:
                if abs(real_a - real_b) > tie * max(real_a, real_b):
                    agree.append((pred_a < pred_b) == (real_a < real_b))
    return statistics.fmean(agree) if agree else None


def executed_over_predicted(plans: list[dict], variants: tuple[str, ...]) -> dict[str, float | None]:
    """Per variant, the mean over its plans of executed / predicted cost (maximum over
    devices): above 1, the cost models were optimistic about the plans it chose."""
    out: dict[str, float | None] = {}
    for v in variants:
        ratios = [max(p["executed_ms"]["total"]) / max(p["predicted_ms"]["total"]) for p in plans if v in p["variants"] and p["predicted_ms"] is not None]
        out[v] = statistics.fmean(ratios) if ratios else None
    return out


def search_time_ratio(planned: list[dict], slow: str, fast: str) -> float | None:
    """Mean search time of ``slow`` over that of ``fast`` on the tasks both planned."""
    both = [p for p in planned if "report" in p.get(slow, {}) and "report" in p.get(fast, {})]
    if not both:
        return None
    return statistics.fmean(p[slow]["report"]["search_time_s"] for p in both) / statistics.fmean(p[fast]["report"]["search_time_s"] for p in both)


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def markdown_table(settings: list[dict]) -> str:
    """One row per setting: mean executed ms (success rate) of each algorithm over the tasks it
    solved, NeuroShard over its strongest rival on the tasks both solved, the ablations."""
    head = [
        "devices",
        "max dim",
        *VARIANTS[: 1 + len(BASELINES)],
        "NeuroShard / strongest heuristic (shared tasks)",
        "NeuroShard / TorchRec (shared tasks)",
        "planning s (" + " / ".join(VARIANTS[: 1 + len(BASELINES)]) + ")",
        "ablations ms (no split / beam width 1 / no grid)",
        "search s (full / no split / beam width 1 / no grid)",
        "no cache: search time x",
        "plan pairs ordered as executed",
        "paper's MLP head: ms (/ default head, shared tasks)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in settings:
        a = s["algorithms"]
        cells = [f"{fmt(a[v]['mean_ms'])} ({a[v]['success']:.0%})" for v in VARIANTS[: 1 + len(BASELINES)]]
        ratio = f"{fmt(s['ratio_vs_best_baseline'], '.3f')} ({s['best_baseline'] or '-'})"
        planning = " / ".join(fmt(t, ".3f") for t in s["planning_s"].values())
        ablations = " / ".join(fmt(a[f"neuroshard-{x}"]["mean_ms"]) for x in ("no-split", "no-beam", "no-grid"))
        search = " / ".join(fmt(a[v]["search_time_s"], ".2f") for v in ("neuroshard", "neuroshard-no-split", "neuroshard-no-beam", "neuroshard-no-grid"))
        lines.append(
            "| "
            + " | ".join(
                [
                    str(s["devices"]),
                    str(s["max_dim"]),
                    *cells,
                    ratio,
                    fmt(s["ratio_vs_torchrec"], ".3f"),
                    planning,
                    ablations,
                    search,
                    fmt(s["cache_speedup"], ".2f"),
                    fmt(s["pairs_ordered_as_executed"], ".2f"),
                    f"{fmt(a[MLP_HEAD]['mean_ms'])} ({fmt(s['mlp_head_ratio'], '.3f')})" if MLP_HEAD in a else "-",
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def save_figure(pairs: list[tuple[float, float]], path: Path) -> None:
    """Predicted against executed cost of NeuroShard's plans (the paper's Fig. 8 left)."""
    predicted, executed = np.array(pairs).T
    fig, (ax,) = harness.figure(width=4.5, height=4.5)
    ax.scatter(executed, predicted, s=10)
    top = max(executed.max(), predicted.max()) * 1.05
    ax.plot([0, top], [0, top], color="grey", linewidth=1)
    ax.set(xlabel="executed cost (ms)", ylabel="predicted cost (ms)", title="NeuroShard plans: simulated vs real", xlim=(0, top), ylim=(0, top))
    harness.save_png(fig, path)


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    models = cost_models(args)
    pool = make_table_pool(args.seed)
    settings, pairs = [], []
    for devices in args.devices:
        for max_dim in args.max_dims:
            summary, setting_pairs = run_setting(devices, max_dim, args, models, pool)
            settings.append(summary)
            pairs += setting_pairs
            a = summary["algorithms"]
            print(
                f"D={devices} max_dim={max_dim}: "
                + ", ".join(f"{v} {fmt(a[v]['mean_ms'])} ms ({a[v]['success']:.0%})" for v in VARIANTS[: 1 + len(BASELINES)])
                + "; NeuroShard/baseline on shared tasks: "
                + ", ".join(f"{b} {fmt(a[b]['ratio'], '.3f')}" for b in BASELINES)
                + f"; plan pairs the cost models order as executed: {fmt(summary['pairs_ordered_as_executed'], '.2f')}"
                + (f"; paper's MLP head / default head: {fmt(summary['mlp_head_ratio'], '.3f')}" if MLP_HEAD in a else ""),
                flush=True,
            )
    predicted, executed = np.array(pairs).T if pairs else (np.zeros(0), np.zeros(0))
    result = {
        "settings": settings,
        "predicted_vs_real_pearson": float(np.corrcoef(predicted, executed)[0, 1]) if len(pairs) > 2 else None,
        "cost_model_metrics": {k: v["test_mse"] for k, v in models["neuroshard"].metrics.items()},
        "hardware": models["neuroshard"].hardware,
        "torchrec": torchrec_version(),
        "batch_size": args.batch_size,
        "seconds": time.perf_counter() - start,
        "command": " ".join(["python", *sys.argv]),
    }
    if pairs:
        save_figure(pairs, args.out / "predicted_vs_real.png")
    (args.out / "table.md").write_text(markdown_table(settings))
    print(markdown_table(settings))
    systems = [
        harness.SystemResult(f"{v} ({s['devices']} devices, max dim {s['max_dim']})", "executed cost per solved task", "ms", harness.Samples(a["task_ms"]))
        for s in settings
        for v, a in s["algorithms"].items()
        if v in VARIANTS[: 1 + len(BASELINES)] and a["task_ms"]
    ]
    harness.finish(harness.ResultRecord("sharding", systems, None, result), args.out / "results.json")


if __name__ == "__main__":
    main()
