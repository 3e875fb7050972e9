"""``distrec simulate``: predicted iteration time and DMT speedups at scales this machine cannot run."""

from __future__ import annotations

import argparse
import json

from distrec.cli.args import EXAMPLES_FORMAT

EXAMPLES = """
examples:
  distrec simulate                                    # V100/A100/H100, 16..512 GPUs, 8 per host, CR 4
  distrec simulate --hardware A100 --compression 8 --gpus 64 128 256 512
  distrec simulate --embedding-dim 64 --features 128 --local-batch 512 -o sim.json

Prints one row per (hardware, GPUs): predicted ms per iteration for flat hybrid parallel,
SPTT and DMT, and the speedups over flat; the last line is all rows as JSON.
"""


def register(sub: argparse._SubParsersAction) -> None:
    from distrec.sim.cluster import HARDWARE
    from distrec.sim.iteration import Workload

    w = Workload()
    p = sub.add_parser("simulate", help="predict iteration times of flat, SPTT and DMT training", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT)
    gpus = [16, 32, 64, 128, 256, 512]
    p.add_argument("--hardware", nargs="+", default=list(HARDWARE), choices=list(HARDWARE), help=f"GPU generations (default {' '.join(HARDWARE)})")
    p.add_argument("--gpus", nargs="+", type=int, default=gpus, metavar="N", help=f"cluster sizes (default {' '.join(map(str, gpus))})")
    p.add_argument("--gpus-per-host", type=int, default=8, metavar="L", help="GPUs per host (default 8)")
    p.add_argument("--compression", type=float, default=4.0, metavar="CR", help="DMT tower modules send CR x fewer bytes across hosts (default 4)")
    p.add_argument("--local-batch", type=int, default=w.local_batch, metavar="B", help=f"samples per GPU (default {w.local_batch})")
    p.add_argument("--features", type=int, default=w.num_features, metavar="F", help=f"sparse features (default {w.num_features})")
    p.add_argument("--embedding-dim", type=int, default=w.embedding_dim, metavar="D", help=f"embedding dimension (default {w.embedding_dim})")
    p.add_argument("--pooling", type=float, default=w.pooling, metavar="P", help=f"indices per feature and sample (default {w.pooling:g})")
    p.add_argument("--dense-mflops", type=float, default=w.dense_mflops, metavar="M", help=f"dense forward MFLOPs per sample (default {w.dense_mflops:g})")
    p.add_argument("--dense-params", type=int, default=w.dense_params, metavar="N", help=f"dense parameters all-reduced (default {w.dense_params:,})")
    p.add_argument(
        "--tower-mflops", type=float, default=w.tower_mflops, metavar="M", help=f"tower modules' forward MFLOPs per sample (default {w.tower_mflops:g})"
    )
    p.add_argument("-o", "--output", metavar="JSON", help="also write the rows to this file")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from distrec.io import atomic_write_json
    from distrec.sim.iteration import Workload, speedup_table
    from distrec.sim.report import format_table

    workload = Workload(
        local_batch=args.local_batch,
        num_features=args.features,
        embedding_dim=args.embedding_dim,
        pooling=args.pooling,
        dense_mflops=args.dense_mflops,
        dense_params=args.dense_params,
        tower_mflops=args.tower_mflops,
    )
    rows = speedup_table(workload, tuple(args.hardware), tuple(args.gpus), args.gpus_per_host, args.compression)
    print(format_table(rows))
    if args.output:
        atomic_write_json(args.output, {"workload": vars(workload), "compression": args.compression, "rows": rows})
    print(json.dumps(rows))
    return 0
