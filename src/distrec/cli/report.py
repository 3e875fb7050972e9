"""``distrec report``: plot the per-iteration time breakdown of runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT

EXAMPLES = """
examples:
  distrec report runs/tw2 runs/cw2 runs/rw2 -o breakdown.png   # one bar per run
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="plot the time breakdown of runs", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories holding breakdown.json")
    p.add_argument("-o", "--output", metavar="PNG", help="image to write (default RUN_DIR/breakdown.png of the first run)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.report import plot_breakdowns

    output = Path(args.output) if args.output else Path(args.runs[0]) / "breakdown.png"
    plot_breakdowns([Path(r) for r in args.runs], output)
    print(json.dumps({"output": str(output)}))
    return 0
