"""``distrec report``: plot the time breakdown and the training curves of runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT

EXAMPLES = """
examples:
  distrec report runs/criteo                        # runs/criteo/breakdown.png and runs/criteo/curves.png
  distrec report runs/criteo runs/ml runs/hot -o runs.png   # one bar and one line per run: runs.png, runs-curves.png
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="plot the time breakdown and the loss and AUC curves of runs",
        description="Plot runs, each labelled by its directory: one stacked bar per run of ms per iteration by component\n"
        "(from breakdown.json), and training loss and validation AUC over steps, one line per run (from metrics.jsonl).\n"
        "A run without breakdown.json (aborted, evaluation only) still gets its curves.",
        epilog=EXAMPLES,
        formatter_class=EXAMPLES_FORMAT,
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories of 'distrec train' (holding breakdown.json, metrics.jsonl or both)")
    p.add_argument(
        "-o",
        "--output",
        metavar="PNG",
        help="the breakdown image; the curves go beside it with '-curves' added to its name (default: RUN_DIR/breakdown.png and "
        "RUN_DIR/curves.png of the first run)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.figures import save_figure
    from distrec.report import breakdown_figure, check_runs, curves_figure
    from distrec.train.run import METRICS_FILE

    runs = [Path(r) for r in args.runs]
    for run_dir in check_runs(runs):
        print(
            f"distrec: warning: {str(run_dir / METRICS_FILE)!r} holds no training loss or validation AUC yet; {str(run_dir)!r} gets a bar but no curve",
            file=sys.stderr,
        )
    if args.output:
        breakdown = Path(args.output)
        curves = breakdown.with_name(f"{breakdown.stem}-curves.png")
    else:
        breakdown, curves = runs[0] / "breakdown.png", runs[0] / "curves.png"
    written = {}
    for name, figure, output in (("breakdown", breakdown_figure(runs), breakdown), ("curves", curves_figure(runs), curves)):
        written[name] = str(save_figure(figure, output)) if figure is not None else None
    print(json.dumps(written))
    return 0
