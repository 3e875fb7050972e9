"""Smaller tables for serving: the file size and held-out AUC of a model exported with float32,
float16 and 8-bit row-wise tables (``distrec export --table-dtype``).

For each real sample a run is trained (or ``--runs`` names trained ones, ``sample=DIR``):

- ``criteo``: the dlrm-kaggle preset on the Criteo sample, ``distrec train --preset dlrm-kaggle
  --data-format criteo --data criteo_kaggle_sample.tsv`` (defaults otherwise: a random 10%
  holdout, early stopping);
- ``movielens``: ``distrec train --config configs/movielens.yaml`` (dlrm-kaggle, a random 10%
  holdout).

Each run is exported with every table dtype; each program scores the run's held-out rows (its
``val`` split, the rows ``distrec evaluate`` scores), and its AUC is set against the
checkpoint's. Prints a table; the last line is one JSON object with, per sample and dtype, the
file's bytes and its ratio to the float32 file, the bytes of the tables and of the dense
layers, the AUC and its change.

    python benchmarks/serving_tables.py                 # trains both: about 10 minutes on 2 idle cores
    python benchmarks/serving_tables.py --runs criteo=runs/criteo-kaggle movielens=runs/movielens
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
from distrec.serving.formats import SERVING_DTYPES
from distrec.serving.predict import Predictor
from distrec.train.evaluate import evaluate_checkpoint, scoring_dataset
from distrec.train.metrics import click_metrics
from distrec.train.run import split_rows

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
SAMPLES = {
    "criteo": ["--preset", "dlrm-kaggle", "--data-format", "criteo", "--data", str(SHARED / "criteo" / "criteo_kaggle_sample.tsv")],
    "movielens": ["--config", str(ROOT / "configs" / "movielens.yaml"), "--data", str(SHARED / "movielens")],
}
DEFAULTS = {"samples": list(SAMPLES), "runs": [""], "out": ""}
HELPS = {"samples": "which samples", "runs": "trained runs to use instead of training, as SAMPLE=DIR", "out": "also write the result JSON here"}


@torch.no_grad()
def held_out_auc(program: Path, batch_size: int = 16384) -> float:
    """AUC of an exported program on the held-out rows of the run it was exported from."""
    predictor = Predictor.from_program(program)
    dataset = scoring_dataset(predictor.cfg, predictor.tables, predictor.num_dense, None, None, progress=False)
    rows = split_rows(dataset, predictor.cfg)["val"]
    labels, scores = [], []
    for batch in dataset.batches(rows, batch_size, shuffle=False):
        labels.append(batch.labels.numpy())
        scores.append(predictor.score(batch))
    return click_metrics(np.concatenate(labels), np.concatenate(scores))["auc"]


def measure(run: Path, scratch: Path) -> dict[str, dict[str, float]]:
    """Per table dtype: the exported file's bytes, its tables' and dense layers' bytes, its held-out AUC."""
    results = {}
    for dtype in SERVING_DTYPES:
        program = scratch / f"{run.name}-{dtype}.pt2"
        done = subprocess.run(
            [sys.executable, "-m", "distrec", "export", "--checkpoint", str(run), "--table-dtype", dtype, "-o", str(program)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"distrec export --table-dtype {dtype} failed:\n{done.stderr[-3000:]}")
        exported = harness.last_json_line(done.stdout)
        results[dtype] = {
            "bytes": exported["bytes"],
            "table_bytes": exported["table_bytes"],
            "dense_bytes": exported["dense_bytes"],
            "auc": held_out_auc(program),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_options(parser, DEFAULTS, HELPS)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="serving-tables-"))
    given = dict(item.split("=", 1) for item in args.runs if item)
    result = {}
    for sample in args.samples:
        run = Path(given[sample]) if sample in given else harness.distrec_train(scratch / sample, SAMPLES[sample], cache_dir=scratch / "cache").out
        checkpoint_auc = evaluate_checkpoint(run, None, None, progress=False)["auc"]
        measured = measure(run, scratch)
        full = measured["fp32"]["bytes"]
        for m in measured.values():
            m.update(size_ratio=round(m["bytes"] / full, 3), auc=round(m["auc"], 5), auc_change=round(m["auc"] - checkpoint_auc, 5))
        result[sample] = {"run": str(run), "checkpoint_auc": round(checkpoint_auc, 5), "dtypes": measured}
        print(f"{sample} (checkpoint AUC {checkpoint_auc:.5f} on its held-out rows):")
        print(f"  {'dtype':6s} {'file bytes':>12s} {'x fp32':>7s} {'tables':>12s} {'dense':>10s} {'AUC':>8s} {'change':>9s}")
        for dtype, m in measured.items():
            print(
                f"  {dtype:6s} {m['bytes']:12,d} {m['size_ratio']:7.3f} {m['table_bytes']:12,d} {m['dense_bytes']:10,d} {m['auc']:8.5f} {m['auc_change']:+9.5f}"
            )
    harness.finish(result, args.out or None)


if __name__ == "__main__":
    main()
