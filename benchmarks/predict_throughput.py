"""Inference throughput: ``distrec predict`` against ``distrec train`` on the same model and data.

The model is the dlrm-kaggle preset (bottom MLP 13-512-256-64-16, 26 tables x ``--table-rows``
rows x 16 floats, top MLP 367-512-256-1) on Criteo-shaped synthetic data of ``--rows`` rows
(Zipf indices, one per feature). One run is trained first and exported; then, for ``--rounds``
rounds, each in a fresh process, interleaved so that all see the same machine load:

- ``train``: ``distrec train`` of that model on that data, ``--train-steps`` steps of batch
  ``--batch-size``: its ``samples_per_s`` (forward, backward and optimizer steps);
- ``predict``: ``distrec predict --checkpoint RUN`` over every row, batches of ``--batch-size``:
  its ``samples_per_s`` (reading batches from the data cache, the forward pass, writing Parquet);
- ``predict_program``: the same with ``--model model.pt2``, the exported program.

Then, in a fresh process (``OMP_WAIT_POLICY=PASSIVE``, as the ``distrec`` command sets it),
what bounds predict: the median ms per batch of building a batch from the cache
(``Dataset.batch``, which predict runs on a prefetch thread beside the model), of the forward
pass (the checkpoint's model and the exported program) and of appending the scores to Parquet,
and the forward pass's matrix-product GFLOP/s against those of one plain matrix product of the
top MLP's first layer's shape on this machine. Predict takes about max(building, forward +
writing) per batch; ``bound`` names the larger side. The last line is one JSON object with every figure.

    python benchmarks/predict_throughput.py                      # about 5 minutes on 2 idle cores
    python benchmarks/predict_throughput.py --rounds 5 --batch-size 16384
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import harness
from distrec.allocator import keep_freed_memory
from distrec.models.tower_modules import mflops_per_sample
from distrec.serving.predict import Predictor
from distrec.serving.scores_file import ScoresWriter
from distrec.train.evaluate import scoring_dataset

DEFAULTS = {"rows": 524_288, "table_rows": 100_000, "batch_size": 2048, "train_steps": 40, "rounds": 3, "repeats": 10, "out": ""}
HELPS = {
    "rows": "synthetic rows predict scores (and train reads)",
    "table_rows": "rows of each of the 26 tables",
    "batch_size": "samples per batch, for train and predict alike",
    "train_steps": "steps of each timed train run",
    "rounds": "interleaved rounds of the three systems",
    "repeats": "timings of each part per batch, in this process",
    "out": "also write the result JSON here",
}


def predict_samples_per_s(model: list[str], out: Path, cache: Path, batch_size: int) -> float:
    """``distrec predict`` in a fresh process: the samples per second it reports."""
    command = [sys.executable, "-m", "distrec", "predict", *model, "-o", str(out), "--batch-size", str(batch_size), "--cache-dir", str(cache), "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"distrec predict {' '.join(model)} failed:\n{done.stderr[-3000:]}")
    return float(harness.last_json_line(done.stdout)["samples_per_s"])


@torch.no_grad()
def parts(run: Path, program: Path, scratch: Path, batch_size: int, repeats: int) -> dict[str, float]:
    """Median ms per batch of each part of predict, measured alone, and the forward's matrix-product speed."""
    keep_freed_memory()  # as predict does on the CPU
    checkpoint = Predictor.from_checkpoint(run)
    exported = Predictor.from_program(program)
    dataset = scoring_dataset(checkpoint.cfg, checkpoint.tables, checkpoint.num_dense, None, None, progress=False)
    rows = np.arange(min(batch_size, dataset.num_rows), dtype=np.int64)
    batch = dataset.batch(rows)
    scores = checkpoint.score(batch)
    with ScoresWriter(scratch / "parts.parquet") as writer:
        write_ms = harness.median_ms(lambda: writer.write(rows, scores, batch.labels.numpy()), repeats)
    ms = {
        "build_batch": harness.median_ms(lambda: dataset.batch(rows), repeats),
        "forward_checkpoint": harness.median_ms(lambda: checkpoint.score(batch), repeats),
        "forward_program": harness.median_ms(lambda: exported.score(batch), repeats),
        "write_parquet": write_ms,
    }
    gflop = mflops_per_sample(checkpoint.model.model, batch) * len(rows) / 1e3
    top = checkpoint.model.model.top[0]
    x, weight = torch.randn(len(rows), top.in_features), top.weight.detach()
    matmul_ms = harness.median_ms(lambda: x @ weight.t(), repeats)
    return {
        "ms_per_batch": ms,
        "gflop_per_batch": gflop,
        "forward_gflop_per_s": gflop / ms["forward_program"] * 1e3,
        "matmul_gflop_per_s": 2 * x.shape[0] * weight.numel() / matmul_ms / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_options(parser, DEFAULTS, HELPS)
    parser.add_argument(harness.WORKER_FLAG, dest="worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(parts(Path(spec["run"]), Path(spec["program"]), Path(spec["scratch"]), spec["batch_size"], spec["repeats"])))
        return
    scratch = Path(tempfile.mkdtemp(prefix="predict-throughput-"))
    cache = scratch / "cache"
    data = ["--preset", "dlrm-kaggle", *harness.set_items([f"data.synthetic.rows={args.rows}", f"data.synthetic.table_rows={args.table_rows}"])]
    data += ["--batch-size", str(args.batch_size)]
    run = harness.distrec_train(scratch / "run", [*data, "--max-steps", str(args.train_steps)], cache_dir=cache).out
    program = scratch / "model.pt2"
    subprocess.run([sys.executable, "-m", "distrec", "export", "--checkpoint", str(run), "-o", str(program)], check=True, capture_output=True)
    systems = {
        "train": lambda r: harness.distrec_train(scratch / f"train-{r}", [*data, "--max-steps", str(args.train_steps)], cache_dir=cache).summary[
            "samples_per_s"
        ],
        "predict": lambda r: predict_samples_per_s(["--checkpoint", str(run)], scratch / f"scores-{r}.parquet", cache, args.batch_size),
        "predict_program": lambda r: predict_samples_per_s(["--model", str(program)], scratch / f"program-{r}.parquet", cache, args.batch_size),
    }
    measured = {name: harness.Samples(values) for name, values in harness.interleaved_rounds(systems, args.rounds).items()}
    spec = {"run": str(run), "program": str(program), "scratch": str(scratch), "batch_size": args.batch_size, "repeats": args.repeats}
    found = harness.run_worker(__file__, spec, env={"OMP_WAIT_POLICY": "PASSIVE", "DISTREC_CACHE": str(cache)})
    ms = found["ms_per_batch"]
    print(f"samples/s, median of {args.rounds} rounds (batch {args.batch_size}, {args.rows:,} rows, 26 tables x {args.table_rows:,} rows):")
    for name, samples in measured.items():
        print(f"  {name:16s} {samples.median:12,.0f}")
    print("ms per batch: " + ", ".join(f"{name} {value:.1f}" for name, value in ms.items()))
    print(
        f"forward: {found['gflop_per_batch']:.2f} GFLOP per batch at {found['forward_gflop_per_s']:.0f} GFLOP/s; one plain matrix product: {found['matmul_gflop_per_s']:.0f} GFLOP/s"
    )
    harness.finish(
        {
            "batch_size": args.batch_size,
            "rows": args.rows,
            "table_rows": args.table_rows,
            "samples_per_s": {name: samples.summary(0) for name, samples in measured.items()},
            "predict_over_train": round(measured["predict"].median / measured["train"].median, 2),
            "program_over_checkpoint": round(measured["predict_program"].median / measured["predict"].median, 2),
            "ms_per_batch": {name: round(value, 2) for name, value in ms.items()},
            "gflop_per_batch": round(found["gflop_per_batch"], 3),
            "forward_gflop_per_s": round(found["forward_gflop_per_s"], 1),
            "matmul_gflop_per_s": round(found["matmul_gflop_per_s"], 1),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "bound": "building batches from the cache" if ms["build_batch"] > ms["forward_checkpoint"] + ms["write_parquet"] else "the forward pass",
        },
        args.out or None,
    )


if __name__ == "__main__":
    main()
