"""Cost-model error against the number of micro-benchmark samples (the NeuroShard paper's Fig. 8).

From one collected cost file (``distrec plan collect`` or ``distrec plan calibrate``), a fixed
share of the samples (``--held-out``, drawn by ``--seed``) is set aside; the models are then
trained on growing nested subsets of the rest and each is scored on the same held-out
samples: the compute model (both heads: the additive, monotone one and the paper's post-sum
MLP, the default) by its R^2 and median relative error of a device's lookup time, and the all-to-all
models per world size by those of a device's forward + backward time. Prints a Markdown
table, saves it with a PNG, and prints the harness's result record as its last line (one
system per model, its held-out median relative error at each subset size).

Usage:
    python benchmarks/cost_model_samples.py --cost-data ~/.cache/distrec/planner/costs.jsonl --out runs/samples
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import harness
from distrec.errors import DistrecError
from distrec.planner.cost_models import COMPUTE_HEADS, comm_inputs, read_cost_samples, start_wait_ms, train_cost_models
from distrec.planner.types import TableSpec


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cost-data", type=Path, required=True, help="a costs.jsonl of distrec plan collect / calibrate")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.125, 0.25, 0.5, 1.0], help="shares of the training samples used")
    p.add_argument("--held-out", type=float, default=0.2, help="share of the samples kept for scoring")
    p.add_argument("--epochs", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/cost_model_samples"))
    return p.parse_args()


def scores(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """R^2 and median relative error of predictions against measurements (any shape)."""
    predicted, measured = predicted.ravel(), measured.ravel()
    residual = float(((predicted - measured) ** 2).mean())
    variance = float(measured.var())
    return {
        "r2": 1 - residual / variance if variance > 0 else 0.0,
        "median_relative_error": float(np.median(np.abs(predicted - measured) / np.maximum(measured, 1e-3))),
    }


def held_out_errors(models, compute: list[dict], comm: list[dict]) -> dict[str, dict[str, float]]:
    """The models' scores on held-out compute samples and, per world size, all-to-all samples."""
    predictor = models.predictor(next(iter(models.comm)))
    tables = [[TableSpec.from_dict(t, r["id"]) for t in r["tables"]] for r in compute]
    predicted = np.array([predictor.device_compute(predictor.embed(ts).sum(axis=0))[0] for ts in tables])
    out = {"compute": scores(predicted, np.array([r["ms"] for r in compute]))}
    for d, (fw, bw) in sorted(models.comm.items()):
        recs = [r for r in comm if r["world_size"] == d]
        if not recs:
            continue
        dims, delays = (np.array([r[k] for r in recs], dtype=np.float64) for k in ("dim_sums", "delays_ms"))
        with torch.no_grad():
            fw_ms = fw(torch.from_numpy(comm_inputs(dims, delays)).float()).double().numpy() + start_wait_ms(delays)
            bw_ms = bw(torch.from_numpy(comm_inputs(dims)).float()).double().numpy()
        measured = np.array([np.add(r["fw_ms"], r["bw_ms"]) for r in recs])
        out[f"comm_{d}"] = scores(fw_ms + bw_ms, measured)
    return out


def write_subset(path: Path, hardware: list[dict], records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in hardware + records))
    return path


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    compute, comm, _ = read_cost_samples([args.cost_data])
    hardware = [json.loads(line) for line in args.cost_data.read_text().splitlines() if line.strip() and json.loads(line).get("kind") == "hardware"][:1]
    rng = np.random.default_rng(args.seed)
    compute = [compute[i] for i in rng.permutation(len(compute))]
    comm = [comm[i] for i in rng.permutation(len(comm))]
    cut_compute, cut_comm = int(args.held_out * len(compute)), int(args.held_out * len(comm))
    test_compute, train_compute = compute[:cut_compute], compute[cut_compute:]
    test_comm, train_comm = comm[:cut_comm], comm[cut_comm:]
    rows = []
    for fraction in sorted(args.fractions):
        subset = train_compute[: int(fraction * len(train_compute))] + train_comm[: int(fraction * len(train_comm))]
        data = write_subset(args.out / f"subset_{fraction:g}.jsonl", hardware, subset)
        for head in COMPUTE_HEADS:
            try:
                models = train_cost_models(data, None, seed=args.seed, epochs=args.epochs, verbose=False, compute_head=head)
            except DistrecError as e:  # too few samples of a kind to train on
                print(f"{fraction:g} of the samples: {e}", file=sys.stderr)
                break
            errors = held_out_errors(models, test_compute, test_comm)
            rows.append(
                {
                    "fraction": fraction,
                    "compute_samples": int(fraction * len(train_compute)),
                    "comm_samples": int(fraction * len(train_comm)),
                    "head": head,
                    "held_out": errors,
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    table = markdown(rows)
    (args.out / "table.md").write_text(table)
    save_figure(rows, args.out / "error_vs_samples.png")
    print(table)
    models = sorted({(r["head"], k) for r in rows for k in r["held_out"]}, key=lambda m: (m[1] != "compute", m))
    systems = [
        harness.SystemResult(
            f"{name} model ({head} head)" if name == "compute" else f"{name.replace('_', ' ')} devices model ({head} head)",
            "held-out median relative error",
            "fraction",
            harness.Samples([r["held_out"][name]["median_relative_error"] for r in rows if r["head"] == head and name in r["held_out"]]),
            extra={
                "training_samples": [r["compute_samples" if name == "compute" else "comm_samples"] for r in rows if r["head"] == head and name in r["held_out"]]
            },
        )
        for head, name in models
    ]
    extra = {
        "rows": rows,
        "held_out_compute": len(test_compute),
        "held_out_comm": len(test_comm),
        "cost_data": str(args.cost_data),
        "seconds": time.perf_counter() - start,
        "command": " ".join(["python", *sys.argv]),
    }
    harness.finish(harness.ResultRecord("cost_model_samples", systems, None, extra))


def markdown(rows: list[dict]) -> str:
    names = sorted({k for r in rows for k in r["held_out"]}, key=lambda k: (k != "compute", k))
    head = ["compute samples", "comm samples", "compute head", *[f"{n} R^2 (median rel. error)" for n in names]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['held_out'][n]['r2']:.3f} ({r['held_out'][n]['median_relative_error']:.1%})" if n in r["held_out"] else "-" for n in names]
        lines.append("| " + " | ".join([str(r["compute_samples"]), str(r["comm_samples"]), r["head"], *cells]) + " |")
    return "\n".join(lines) + "\n"


def save_figure(rows: list[dict], path: Path) -> None:
    fig, (ax,) = harness.figure()
    for head in COMPUTE_HEADS:
        mine = [r for r in rows if r["head"] == head]
        ax.plot(
            [r["compute_samples"] for r in mine], [r["held_out"]["compute"]["median_relative_error"] for r in mine], marker="o", label=f"compute ({head} head)"
        )
    monotone = [r for r in rows if r["head"] == COMPUTE_HEADS[0]]
    for name in sorted({k for r in monotone for k in r["held_out"] if k != "compute"}):
        ax.plot(
            [r["comm_samples"] for r in monotone],
            [r["held_out"][name]["median_relative_error"] for r in monotone],
            marker="s",
            linestyle="--",
            label=name.replace("_", " ") + " devices",
        )
    ax.set(xscale="log", xlabel="training samples (compute; all-to-all for comm)", ylabel="held-out median relative error", title="cost-model error vs samples")
    ax.legend(fontsize=8)
    harness.save_png(fig, path)


if __name__ == "__main__":
    main()
