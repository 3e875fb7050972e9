"""``distrec export``: a trained model, from any checkpoint kind, as one self-contained
program (``torch.export``, or ONNX) and the JSON that says how to feed it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from distrec.errors import DistrecError
from distrec.io import atomic_path
from distrec.serving.formats import ProgramFormat, ServingDtype
from distrec.serving.inputs import example_inputs
from distrec.serving.lookup import use_serving_tables
from distrec.serving.manifest import describe, manifest_path
from distrec.serving.onnx_format import save_onnx
from distrec.serving.program import export_program
from distrec.train.evaluate import load_trained_model

PROGRAM_KINDS = {"pt2": "torch.export", "onnx": "onnx"}
"""The ``program_format`` the JSON names for each ``--format``."""


def export_checkpoint(checkpoint: Path, out: Path, table_dtype: ServingDtype | None = None, program_format: ProgramFormat = "pt2") -> dict[str, Any]:
    """Export the model of a run (its best one if it kept one, else its last) or checkpoint
    folder to ``out`` and its JSON to ``out`` + ``.json``, both written atomically.

    The tables are gathered from any checkpoint kind (``load_trained_model``) and stored as
    ``table_dtype`` (default: as the run trained them, ``model.table_dtype``). Returns what was written: paths, bytes of the file, the tables and the
    dense layers, and whether onnxruntime checked an ONNX model.

    Raises:
        DistrecError: ``out`` or its JSON exists, the checkpoint is not one, or (ONNX) the
            exporter cannot translate the model.
    """
    out = Path(out)
    for path in (out, manifest_path(out)):
        if path.exists():
            raise DistrecError(f"{str(path)!r} exists; remove it or pass another -o")
    model, cfg, tables, meta = load_trained_model(checkpoint, torch.device("cpu"), best=True)
    table_dtype = table_dtype or cfg.model.table_dtype
    stored = use_serving_tables(model, table_dtype)
    table_rows = [t.num_rows for t in tables]
    program = export_program(model, meta["num_dense"], table_rows)
    table_bytes = sum(s.table_bytes for s in stored)
    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    document = describe(cfg, meta, table_dtype, table_bytes, dense_bytes, out, PROGRAM_KINDS[program_format])
    checked = None
    with atomic_path(manifest_path(out)) as manifest_file, atomic_path(out) as program_file:
        if program_format == "onnx":
            checked = save_onnx(program, program_file, example_inputs(meta["num_dense"], table_rows, batch_size=16))
        else:
            with open(program_file, "wb") as f:
                torch.export.save(program, f)
        manifest_file.write_text(json.dumps(document, indent=2) + "\n")
    return {
        "program": str(out),
        "manifest": str(manifest_path(out)),
        "format": program_format,
        "table_dtype": table_dtype,
        "bytes": out.stat().st_size,
        "table_bytes": table_bytes,
        "dense_bytes": dense_bytes,
        "checkpoint": meta["checkpoint"],
        **({"checked_with_onnxruntime": checked} if checked is not None else {}),
    }
