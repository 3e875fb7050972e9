"""``distrec partition``: group a trained model's features into balanced towers (DMT's TP)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from distrec.cli.args import EXAMPLES_FORMAT

EXAMPLES = """
examples:
  distrec partition --checkpoint runs/synth --towers 4 --strategy coherent --max-ratio 1.5 -o towers.json
  distrec partition --checkpoint runs/criteo --towers 2 --strategy diverse -o towers.json --plot sim.png
  distrec partition --checkpoint runs/criteo --towers 4 --interaction cosine -o towers.json   # the paper's measure
  distrec partition --checkpoint runs/criteo --towers 4 --strategy naive -o naive.json   # strided baseline

Writes towers.json (feature names of each tower; tower t goes to host t) and a PNG of the
feature-interaction matrix ordered by tower (default: towers.png beside towers.json).
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("partition", help="group features into towers for DMT", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    p.add_argument("--checkpoint", required=True, metavar="RUN", help="a trained run directory or its checkpoint/ folder")
    p.add_argument("--towers", required=True, type=int, metavar="T", help="number of towers (one per host)")
    p.add_argument(
        "--strategy",
        default="coherent",
        choices=["coherent", "diverse", "naive"],
        help="coherent: interacting features share a tower; diverse: they are spread; naive: feature i in tower i %% T",
    )
    p.add_argument("--max-ratio", type=float, default=2.0, metavar="K", help="largest tower <= K x smallest (default 2)")
    p.add_argument("-o", "--output", required=True, metavar="JSON", help="the tower partition to write")
    p.add_argument("--plot", metavar="PNG", help="similarity matrix ordered by tower (default: OUTPUT with .png)")
    p.add_argument(
        "--interaction",
        default="pairwise",
        choices=["pairwise", "cosine"],
        help="pairwise: joint effect of two features on the logit (default); cosine: |mean cosine| of their embeddings (the DMT paper's)",
    )
    p.add_argument("--sample-rows", type=int, default=2048, metavar="N", help="data rows the interactions are measured on")
    p.add_argument("--dims", type=int, default=4, metavar="N", help="dimensions of the feature coordinates (default 4)")
    p.add_argument("--steps", type=int, default=500, metavar="N", help="Adam steps fitting the coordinates (default 500)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the sample, coordinates and k-means")
    p.add_argument("--data", metavar="PATH", help="sample from this file instead of the run's data (same format)")
    p.add_argument("--data-format", choices=["criteo", "movielens", "csv", "parquet", "synthetic"], help="format of --data")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.errors import DistrecError
    from distrec.towers.from_run import feature_interaction, trained_sample
    from distrec.towers.partition import partition_features, plot_similarity

    if args.dims < 1 or args.steps < 1:
        raise DistrecError(f"--dims {args.dims} and --steps {args.steps} must both be at least 1")
    model, batch, names = trained_sample(Path(args.checkpoint), args.sample_rows, args.seed, args.data, args.data_format, progress=not args.no_progress)
    interaction = feature_interaction(model, batch, args.interaction, args.seed)
    part = partition_features(names, args.towers, args.strategy, interaction, args.max_ratio, args.dims, args.steps, args.seed)
    output = Path(args.output)
    plot = Path(args.plot) if args.plot else output.with_suffix(".png")
    part.save(output)
    plot_similarity(interaction, names, part, plot)
    print(
        json.dumps(
            {"output": str(output), "plot": str(plot), "interaction": args.interaction, "tower_sizes": [len(t) for t in part.towers], "stress": part.stress}
        )
    )
    return 0
