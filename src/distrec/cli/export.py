"""``distrec export``: a trained model as one self-contained program (torch.export or ONNX) and its JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT, add_trust_arg, trusting

EXAMPLES = """
examples:
  distrec export --checkpoint runs/criteo -o model.pt2
  distrec export --checkpoint runs/criteo --table-dtype int8 -o model-int8.pt2

Writes the program and, beside it, FILE.json: the input signature, the features in order,
the dense transform and how raw categorical values become table rows (docs/serving.md).
torch.export.load(FILE).module()(dense, values, lengths) runs it without distrec installed.
--format onnx writes an ONNX model instead (needs pip install 'distrec[onnx]').
"""


def register(sub: argparse._SubParsersAction) -> None:
    from distrec.serving.formats import PROGRAM_FORMATS, SERVING_DTYPES

    p = sub.add_parser("export", help="export a trained model as a torch.export (or ONNX) program", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    p.add_argument("--checkpoint", required=True, metavar="RUN", help="a run directory (its best model if it kept one, else its last) or a checkpoint folder")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the program to write (it must not exist; FILE.json is written beside it)")
    p.add_argument("--format", choices=PROGRAM_FORMATS, default="pt2", help="pt2: a torch.export program (default); onnx: an ONNX model")
    p.add_argument(
        "--table-dtype",
        choices=SERVING_DTYPES,
        help="how the embedding rows are stored: fp32, fp16, bf16, or int8 (row-wise, a float32 scale and bias per row); default: as the run trained them (--table-dtype of train)",
    )
    add_trust_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.serving.export import export_checkpoint

    with trusting(args):
        result = export_checkpoint(Path(args.checkpoint), Path(args.output), args.table_dtype, args.format)
    print(json.dumps(result))
    return 0
