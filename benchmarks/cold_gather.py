"""How long gathering random rows from the disk tier takes, with and without reading ahead.

A gather of random rows from a memory map whose pages are evicted (``madvise(MADV_PAGEOUT)``)
faults on each row's page in turn; ``distrec.hotline.readahead.RowReadahead`` first starts
the reads of every page at once (``MADV_WILLNEED``). Rounds alternate the two ways on fresh
random rows, evicting every page before each gather; two more ways gather rows already in
the page cache, with and without the (then useless) readahead, to show what it costs when it
cannot help. It prints the median ms per gather of each, the readahead's own submission time,
and the ratios; the last line is the harness's result record (every gather's ms per way,
``ratio`` the readahead's speed-up from disk) with every figure.

Usage:
    python benchmarks/cold_gather.py                 # ~30 s, a 1 GB scratch file
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

import harness
from distrec.hotline.readahead import RowReadahead
from distrec.hotline.tiers import map_scratch_file
from hotline import PageCacheLimit  # benchmarks/hotline.py


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4_000_000, help="rows of the table")
    p.add_argument("--row-floats", type=int, default=64, help="float32 per row")
    p.add_argument("--gather-rows", type=int, default=300, help="random rows per gather (Hotline's cold rows per step)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the scratch file goes (unlinked at once)")
    args = p.parse_args()
    table = torch.from_numpy(map_scratch_file(Path(args.dir), args.rows, args.row_floats))
    table.fill_(1.0)
    readahead = RowReadahead(table)
    gen = torch.Generator().manual_seed(0)
    submit = harness.Samples()  # ms to submit the readahead of the "readahead" way

    def gather(limit: PageCacheLimit, way: str, round_index: int) -> float:
        """ms of one gather of fresh random rows, every page evicted first (then read back for ``cached*``)."""
        ids = torch.randint(0, args.rows, (args.gather_rows,), generator=gen)
        limit.evict_all()
        if way.startswith("cached"):
            torch.index_select(table, 0, ids)  # now in the page cache
        started = time.perf_counter()
        if way.endswith("readahead"):
            readahead(ids)
            if way == "readahead":
                submit.add(1000 * (time.perf_counter() - started))
        torch.index_select(table, 0, ids)
        return 1000 * (time.perf_counter() - started)

    ways = ("fault_by_fault", "readahead", "cached", "cached_readahead")
    with PageCacheLimit(table, budget_bytes=0) as limit:
        ms = harness.interleaved_rounds({way: partial(gather, limit, way) for way in ways}, args.rounds)
    readahead.close()
    medians = {way: harness.Samples(v).median for way, v in ms.items()} | {"readahead_submit": submit.median}
    result = {
        "gather_rows": args.gather_rows,
        "median_ms": medians,
        "speedup_readahead": medians["fault_by_fault"] / medians["readahead"],
        "cost_readahead_cached": medians["cached_readahead"] / medians["cached"],
    }
    for way, value in medians.items():
        print(f"{way:>16}: {value:6.2f} ms")
    print(f"readahead gathers {result['speedup_readahead']:.2f}x faster from disk, {result['cost_readahead_cached']:.2f}x the time from the page cache")
    systems = [harness.SystemResult(way, "gather time", "ms", harness.Samples(v)) for way, v in ms.items()]
    harness.finish(harness.ResultRecord("cold_gather", systems, result["speedup_readahead"], result))


if __name__ == "__main__":
    main()
