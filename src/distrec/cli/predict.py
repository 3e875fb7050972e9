"""``distrec predict``: click probabilities of every row of a data file, written to Parquet or CSV."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT, add_data_args, add_trust_arg, check_at_least, data_options, trusting

EXAMPLES = """
examples:
  distrec predict --checkpoint runs/criteo --data ../shared/data/criteo/criteo_kaggle_tiny.tsv \\
      --data-format criteo -o scores.parquet
  distrec predict --model model.pt2 --data ../shared/data/criteo/criteo_kaggle_tiny.tsv \\
      --data-format criteo -o scores.csv

Writes one row per scored input row, in input order: row (its position among the input's
valid rows, from 0), score (the click probability) and label. Malformed input rows are
skipped and counted as 'distrec train' skips them (--strict stops at the first instead).
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="score every row of a data file with a trained or exported model", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", metavar="RUN", help="a run directory (its best model if it kept one, else its last) or a checkpoint folder")
    model.add_argument("--model", metavar="PT2", help="a program written by 'distrec export' (trusted input: loading it runs its graph)")
    add_data_args(p, data_default="the data the model was trained on, every row")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the scores: .parquet or .csv (written atomically, replacing an existing file)")
    p.add_argument("--batch-size", type=int, default=16384, metavar="B", help="samples scored at a time (default 16384)")
    add_trust_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.serving.predict import Predictor, predict_file
    from distrec.serving.scores_file import scores_format

    check_at_least("--batch-size", args.batch_size, 1)
    scores_format(Path(args.output))
    with trusting(args):
        predictor = Predictor.from_checkpoint(Path(args.checkpoint)) if args.checkpoint else Predictor.from_program(Path(args.model))
    result = predict_file(predictor, Path(args.output), **data_options(args), batch_size=args.batch_size, progress=not args.no_progress)
    print(json.dumps(result))
    return 0
