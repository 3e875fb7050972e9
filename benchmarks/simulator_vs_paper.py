"""The simulator's DMT speedups against the ones the DMT paper reports (``distrec.sim.paper_speedups``).

For every reported point: the paper's speedup, the simulated one (``distrec simulate``'s
``dmt`` over ``flat`` at the point's settings, the largest where the point spans several),
the setting it comes from and the relative error; then the same with unbounded compression
(no cross-host embedding bytes at all), the most DMT can gain in this model for the workload.
The last line is the harness's result record: the paper's and the simulator's speedups (one
value per point), ``ratio`` (the simulator's median over the paper's), ``points`` (label,
source, paper, simulated, hardware, gpus, rel_error), ``max_rel_error``, ``target`` and
``ceiling`` (the unbounded-compression points).

    python benchmarks/simulator_vs_paper.py                  # default workload of distrec simulate, CR 4
    python benchmarks/simulator_vs_paper.py --compression 8
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

import harness
from distrec.sim.paper_speedups import PAPER_SPEEDUPS, compare_with_paper
from distrec.sim.report import format_table
from distrec.sim.workload import Workload

TARGET = 0.15  # the aim: within 15% of the paper at every point
UNBOUNDED_COMPRESSION = 1e12  # tower modules that send (almost) nothing across hosts
COLUMNS = ["label", "source", "paper", "simulated", "hardware", "gpus", "rel_error"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compression", type=float, default=4.0, metavar="CR", help="DMT compression ratio (default 4, as distrec simulate)")
    args = parser.parse_args()
    workload = Workload()
    result = compare_with_paper(PAPER_SPEEDUPS, workload, args.compression)
    ceiling = compare_with_paper(PAPER_SPEEDUPS, workload, UNBOUNDED_COMPRESSION)
    print(f"DMT (CR {args.compression:g}) over flat, paper vs simulated")
    print(format_table(result["points"], COLUMNS, digits=3))
    print("unbounded compression (the most DMT gains in this model)")
    print(format_table(ceiling["points"], COLUMNS, digits=3))
    print(f"max relative error {result['max_rel_error']:.3f} (target {TARGET})")
    systems = [
        harness.SystemResult(name, "DMT speedup over flat", "x", harness.Samples([p[key] for p in result["points"]]))
        for name, key in (("paper", "paper"), ("simulator", "simulated"))
    ]
    extra = {**result, "target": TARGET, "compression": args.compression, "workload": asdict(workload), "ceiling": ceiling}
    harness.finish(harness.ResultRecord("simulator_vs_paper", systems, systems[1].median / systems[0].median, extra))


if __name__ == "__main__":
    main()
