"""``distrec simulate``: predicted iteration times and weak scaling of flat, SPTT, DMT, 2D and DMT x 2D at scales this machine cannot run."""

from __future__ import annotations

import argparse
import json

from distrec.cli.args import EXAMPLES_FORMAT

EXAMPLES = """
examples:
  distrec simulate                                    # all schemes, V100/A100/H100, 16..4096 GPUs, 8 per host
  distrec simulate --schemes flat dmt 2d dmt-2d --gpus 16 64 256 1024 4096 -o sim.json   # also sim.png
  distrec simulate --hardware H100 --schemes 2d --replica-groups 8 --replica-sync exact
  distrec simulate --hardware H100 --schemes flat 2d --replica-layout strided   # TorchRec's placement
  distrec simulate --hardware A100 --compression 8 --gpus 64 128 256 512 --plot eff.png

Prints one row per (hardware, GPUs): predicted ms per iteration of each scheme, the replica
groups G the 2D schemes use (the fastest G at each size unless --replica-groups), and each
scheme's weak-scaling efficiency (per-GPU throughput over its own at the smallest size). The
last line is one JSON object: the rows and weak_scaling_efficiency[hardware][scheme][gpus].
"""


def register(sub: argparse._SubParsersAction) -> None:
    from distrec.sim.cluster import HARDWARE
    from distrec.sim.components import LAYOUTS, REPLICA_SYNCS
    from distrec.sim.iteration import SCHEMES
    from distrec.sim.workload import Workload

    w = Workload()
    p = sub.add_parser(
        "simulate", help="predict iteration times and weak scaling of flat, SPTT, DMT, 2D and DMT x 2D", epilog=EXAMPLES, formatter_class=EXAMPLES_FORMAT
    )
    gpus = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES), help=f"schemes to predict (default {' '.join(SCHEMES)})")
    p.add_argument("--hardware", nargs="+", default=list(HARDWARE), choices=list(HARDWARE), help=f"GPU generations (default {' '.join(HARDWARE)})")
    p.add_argument("--gpus", nargs="+", type=int, default=gpus, metavar="N", help=f"cluster sizes (default {' '.join(map(str, gpus))})")
    p.add_argument("--gpus-per-host", type=int, default=8, metavar="L", help="GPUs per host (default 8)")
    p.add_argument("--compression", type=float, default=4.0, metavar="CR", help="DMT tower modules send CR x fewer bytes across hosts (default 4)")
    p.add_argument("--replica-groups", type=int, metavar="G", help="2D schemes: G replica groups at every size (default: the fastest G at each size)")
    p.add_argument("--replica-sync", default="periodic", choices=list(REPLICA_SYNCS), help="2D schemes: how replicas stay consistent (default periodic)")
    p.add_argument("--sync-every", type=int, default=10, metavar="K", help="2D periodic sync: average the replicas every K steps (default 10)")
    p.add_argument(
        "--replica-layout",
        default="contiguous",
        choices=list(LAYOUTS),
        help="2D groups of consecutive ranks (distrec's), or strided so that a shard's replicas share a host (TorchRec's); DMT x 2D is always contiguous",
    )
    p.add_argument("--local-batch", type=int, default=w.local_batch, metavar="B", help=f"samples per GPU (default {w.local_batch})")
    p.add_argument("--features", type=int, default=w.num_features, metavar="F", help=f"sparse features (default {w.num_features})")
    p.add_argument("--embedding-dim", type=int, default=w.embedding_dim, metavar="D", help=f"embedding dimension (default {w.embedding_dim})")
    p.add_argument("--pooling", type=float, default=w.pooling, metavar="P", help=f"indices per feature and sample (default {w.pooling:g})")
    p.add_argument("--table-rows", type=int, default=w.table_rows, metavar="R", help=f"rows per table (default {w.table_rows:,})")
    p.add_argument("--dense-mflops", type=float, default=w.dense_mflops, metavar="M", help=f"dense forward MFLOPs per sample (default {w.dense_mflops:g})")
    p.add_argument("--dense-params", type=int, default=w.dense_params, metavar="N", help=f"dense parameters all-reduced (default {w.dense_params:,})")
    p.add_argument(
        "--tower-mflops", type=float, default=w.tower_mflops, metavar="M", help=f"tower modules' forward MFLOPs per sample (default {w.tower_mflops:g})"
    )
    p.add_argument("-o", "--output", metavar="JSON", help="also write the result (the last line's object) to this file")
    p.add_argument("--plot", metavar="PNG", help="efficiency vs GPUs figure (default: OUTPUT with .png when -o is given)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from dataclasses import asdict
    from pathlib import Path

    from distrec.io import atomic_write_json
    from distrec.sim.iteration import TWO_D_SCHEMES
    from distrec.sim.report import format_table, plot_efficiency
    from distrec.sim.scaling import scaling_table, weak_scaling_efficiency
    from distrec.sim.workload import Workload

    workload = Workload(
        local_batch=args.local_batch,
        num_features=args.features,
        embedding_dim=args.embedding_dim,
        pooling=args.pooling,
        table_rows=args.table_rows,
        dense_mflops=args.dense_mflops,
        dense_params=args.dense_params,
        tower_mflops=args.tower_mflops,
    )
    schemes = list(dict.fromkeys(args.schemes))
    rows = scaling_table(
        workload,
        args.hardware,
        args.gpus,
        args.gpus_per_host,
        schemes,
        args.compression,
        args.replica_sync,
        args.sync_every,
        args.replica_groups,
        args.replica_layout,
    )
    columns = ["hardware", "gpus", "hosts", *(f"{s}_ms" for s in schemes), *(f"{s}_groups" for s in schemes if s in TWO_D_SCHEMES)]
    print(format_table(rows, columns + [f"efficiency_{s}" for s in schemes]))
    result = {
        "workload": asdict(workload),
        "compression": args.compression,
        "replica_sync": args.replica_sync,
        "sync_every": args.sync_every,
        "replica_groups": args.replica_groups or "fastest",
        "replica_layout": args.replica_layout,
        "rows": rows,
        "weak_scaling_efficiency": weak_scaling_efficiency(rows, schemes),
    }
    plot = Path(args.plot) if args.plot else Path(args.output).with_suffix(".png") if args.output else None
    if plot is not None:
        sync = "exact" if args.replica_sync == "exact" else f"periodic, every {args.sync_every} steps"
        title = f"{args.local_batch} samples per GPU, {args.gpus_per_host} GPUs per host; 2D: {args.replica_layout} groups, replica sync {sync}"
        plot_efficiency(rows, schemes, plot, title)
        result["plot"] = str(plot)
    if args.output:
        atomic_write_json(args.output, result)
    print(json.dumps(result))
    return 0
