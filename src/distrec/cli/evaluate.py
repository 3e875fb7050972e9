"""``distrec evaluate``: metrics of a saved model on a data set."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT, add_data_args, add_trust_arg, check_at_least, data_options, trusting

EXAMPLES = """
examples:
  distrec evaluate --checkpoint runs/criteo --data ../shared/data/criteo/criteo_kaggle_tiny.tsv \\
      --data-format criteo
  distrec evaluate --checkpoint runs/terabyte --data criteo/day_22.gz criteo/day_23.gz --data-format criteo
  distrec evaluate --checkpoint runs/terabyte --split test    # the files the run held out (files:1)
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="evaluate a checkpoint on data", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="a run directory or its checkpoint/ folder")
    add_data_args(p, data_default="the run's own data, scoring its --split")
    p.add_argument(
        "--split",
        choices=["val", "test", "all"],
        default="val",
        help="without --data: which of the run's rows to score, split as the run split them (default val)",
    )
    p.add_argument("--batch-size", type=int, default=16384, metavar="B", help="evaluation batch size (default 16384)")
    add_trust_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.train.evaluate import evaluate_checkpoint

    check_at_least("--batch-size", args.batch_size, 1)
    with trusting(args):
        result = evaluate_checkpoint(Path(args.checkpoint), **data_options(args), batch_size=args.batch_size, progress=not args.no_progress, split=args.split)
    print(json.dumps(result))
    return 0
