"""``distrec data prepare|synth``: parse input once into the cache, or write synthetic data."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT, add_config_args, add_data_args, config_from_args

EXAMPLES = """
examples:
  distrec data prepare --data-format criteo --data day_0.gz       # parse once into the cache
  distrec data prepare --data-format criteo --data criteo/day_*.gz # many files: each cached on its own
  distrec data prepare --data-format parquet --data s3://bucket/clicks/ --schema schema.yaml
  distrec data prepare --data-format csv --data clicks.csv --schema schema.yaml
  distrec data synth -o synthetic.tsv --rows 100000 --set data.synthetic.zipf_exponent=1.2
"""


def register(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="prepare or generate data", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    data.set_defaults(handler=lambda args, argv: data.print_help() or 2)
    actions = data.add_subparsers(dest="data_command", metavar="ACTION")
    prepare = actions.add_parser("prepare", help="parse input once into the columnar cache", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    add_config_args(prepare)
    add_data_args(prepare)
    prepare.set_defaults(handler=run_prepare)
    synth = actions.add_parser("synth", help="write synthetic Criteo-format TSV", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    add_config_args(synth)
    synth.add_argument("-o", "--output", required=True, metavar="FILE", help="TSV file to write (.gz compresses)")
    synth.add_argument("--rows", type=int, metavar="N", help="rows to write (default data.synthetic.rows)")
    synth.add_argument("--seed", type=int, metavar="S", help="generator seed (default data.synthetic.seed)")
    synth.add_argument("--no-progress", action="store_true", help="no progress bar")
    synth.set_defaults(handler=run_synth)


def run_prepare(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.data import prepare, read_manifest

    cfg = config_from_args(args)
    started = time.perf_counter()
    cache = prepare(cfg.data, progress=not args.no_progress)
    seconds = time.perf_counter() - started
    manifest = read_manifest(cache)
    files = {"files": len(manifest["files"])} if "files" in manifest else {}
    shown = {k: manifest[k] for k in ("rows", "malformed_rows", "malformed_lines") if k in manifest}
    print(json.dumps({"cache": str(cache), **files, **shown, "seconds": round(seconds, 3)}))
    return 0


def run_synth(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec import config
    from distrec.data import synthesize

    cfg = config_from_args(args)
    if args.rows is not None:
        cfg.data.synthetic.rows = args.rows
    if args.seed is not None:
        cfg.data.synthetic.seed = args.seed
    config.validate(cfg)
    synthesize(cfg.data.synthetic, Path(args.output), progress=not args.no_progress)
    print(json.dumps({"output": args.output, "rows": cfg.data.synthetic.rows}))
    return 0
