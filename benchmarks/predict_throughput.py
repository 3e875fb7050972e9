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

Then, in this process, what bounds predict: the median ms per batch of building a batch from
the cache (``Dataset.batch``, which predict runs on a prefetch thread beside the model), of the
forward pass (the checkpoint's model and the exported program) and of appending the scores to
Parquet. Predict takes about max(building, forward + writing) per batch; ``bound`` names the
larger side. The last line is one JSON object with every figure.

    python benchmarks/predict_throughput.py                      # about 3 minutes on 2 idle cores
    python benchmarks/predict_throughput.py --rounds 5 --batch-size 16384
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import harness
from distrec.serving.predict import Predictor
from distrec.serving.scores_file import ScoresWriter
from distrec.train.evaluate import scoring_dataset

DEFAULTS = {"rows": 131_072, "table_rows": 100_000, "batch_size": 2048, "train_steps": 40, "rounds": 3, "repeats": 10, "out": ""}
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
def parts_ms(run: Path, program: Path, scratch: Path, batch_size: int, repeats: int) -> dict[str, float]:
    """Median ms per batch of each part of predict, measured alone in this process."""
    checkpoint = Predictor.from_checkpoint(run)
    exported = Predictor.from_program(program)
    dataset = scoring_dataset(checkpoint.cfg, checkpoint.tables, checkpoint.num_dense, None, None, progress=False)
    rows = np.arange(min(batch_size, dataset.num_rows), dtype=np.int64)
    batch = dataset.batch(rows)
    scores = checkpoint.score(batch)
    with ScoresWriter(scratch / "parts.parquet") as writer:
        write_ms = harness.median_ms(lambda: writer.write(rows, scores, batch.labels.numpy()), repeats)
    return {
        "build_batch": harness.median_ms(lambda: dataset.batch(rows), repeats),
        "forward_checkpoint": harness.median_ms(lambda: checkpoint.score(batch), repeats),
        "forward_program": harness.median_ms(lambda: exported.score(batch), repeats),
        "write_parquet": write_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_options(parser, DEFAULTS, HELPS)
    args = parser.parse_args()
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
    parts = parts_ms(run, program, scratch, args.batch_size, args.repeats)
    scoring = parts["forward_checkpoint"] + parts["write_parquet"]
    print(f"samples/s, median of {args.rounds} rounds (batch {args.batch_size}, {args.rows:,} rows, 26 tables x {args.table_rows:,} rows):")
    for name, samples in measured.items():
        print(f"  {name:16s} {samples.median:12,.0f}")
    print("ms per batch: " + ", ".join(f"{name} {ms:.1f}" for name, ms in parts.items()))
    harness.finish(
        {
            "batch_size": args.batch_size,
            "rows": args.rows,
            "table_rows": args.table_rows,
            "samples_per_s": {name: samples.summary(0) for name, samples in measured.items()},
            "predict_over_train": round(measured["predict"].median / measured["train"].median, 2),
            "program_over_checkpoint": round(measured["predict_program"].median / measured["predict"].median, 2),
            "ms_per_batch": {name: round(ms, 2) for name, ms in parts.items()},
            "bound": "building batches from the cache" if parts["build_batch"] > scoring else "the forward pass and writing",
        },
        args.out or None,
    )


if __name__ == "__main__":
    main()
