"""Lookups and row updates on a table on huge pages against the same table on 4 KiB pages.

``distrec.allocator.empty_table`` (what distrec's embedding modules allocate their tables
with) asks the kernel for 2 MiB pages; ``torch.empty`` gets 4 KiB pages while transparent
huge pages are in ``madvise`` mode. Both tables hold the same rows; in the same process,
alternating in rounds, this times ``distrec.kernels.bags.pool`` (the lookup) and
``distrec.kernels.row_updates.rowwise_adagrad_rows`` (the update of the grouped rows) on
each, for ``bag_kernels.py``'s batch. Medians in ms; the last line is the harness's result
record (one system per part, thread count and page size, its time per round), with the share
of the huge-page table that the kernel did put on huge pages.

Usage:
    python benchmarks/huge_pages.py                                  # 26 x 100,000 x 64, 20 per bag
    python benchmarks/huge_pages.py --pooling-factor 1 --threads 1 2
"""

from __future__ import annotations

import torch

import harness
from bag_kernels import batch_parser, make_batch
from distrec.allocator import empty_table
from distrec.kernels import bags as kernels
from distrec.kernels import row_updates


def huge_page_bytes() -> int:
    """Bytes of this process's anonymous memory on huge pages (Linux's /proc/self/smaps_rollup)."""
    with open("/proc/self/smaps_rollup") as rollup:
        return next(int(line.split()[1]) * 1024 for line in rollup if line.startswith("AnonHugePages:"))


def main(argv: list[str] | None = None) -> dict:
    p = batch_parser(__doc__, rounds=5, repeats=5)
    args = p.parse_args(argv)
    args.distribution = "uniform"
    values, offsets, base, num_rows, rows_of_batch = make_batch(args)
    segments = kernels.feature_segments(values, offsets, base, num_rows)
    tables = {"small_pages": torch.empty(rows_of_batch.shape), "huge_pages": empty_table(*rows_of_batch.shape)}
    for table in tables.values():
        table.copy_(rows_of_batch)  # first touch: the pages are taken here
    del rows_of_batch
    accumulators = {name: torch.zeros(table.shape[0]) for name, table in tables.items()}
    rows, bounds, picks = kernels.group(segments)
    grad = torch.randn(args.batch * args.tables, args.dim, generator=torch.Generator().manual_seed(args.seed + 1))

    def timed(part: str, threads: int, name: str):
        table, accumulator = tables[name], accumulators[name]
        if part == "lookup":
            call = lambda: kernels.pool(table, segments, threads)  # noqa: E731
        else:
            call = lambda: row_updates.rowwise_adagrad_rows(table, accumulator, rows, bounds, picks, grad, 1e-9, 1e-10)  # noqa: E731

        def run(r: int) -> float:
            torch.set_num_threads(threads)
            return harness.median_ms(call, args.repeats)

        return run

    # the two tables of a part take turns, the one that goes first alternating
    systems = {f"{part}, {threads} threads, {name}": timed(part, threads, name) for threads in args.threads for part in ("lookup", "update") for name in tables}
    times = harness.interleaved_rounds(systems, args.rounds, after_round=lambda r: print(f"round {r + 1}/{args.rounds} done", flush=True), order="alternate")
    results = []
    print(f"\n{'part':7s} {'threads':>7s} {'4 KiB ms':>9s} {'huge ms':>8s} {'speed-up':>8s}")
    for threads in args.threads:
        for part in ("lookup", "update"):
            small = harness.Samples(times[f"{part}, {threads} threads, small_pages"]).median
            huge = harness.Samples(times[f"{part}, {threads} threads, huge_pages"]).median
            results.append(
                {"part": part, "threads": threads, "small_pages_ms": round(small, 2), "huge_pages_ms": round(huge, 2), "speedup": round(small / huge, 3)}
            )
            print(f"{part:7s} {threads:7d} {small:9.2f} {huge:8.2f} {small / huge:8.3f}")
    huge = tables["huge_pages"]
    share = huge_page_bytes() / (huge.numel() * huge.element_size())  # the other tables are on 4 KiB pages
    measured = [harness.SystemResult(name, "time per call (median of the round's calls)", "ms", harness.Samples(t)) for name, t in times.items()]
    return harness.finish(harness.ResultRecord("huge_pages", measured, None, {"config": vars(args), "huge_page_share": round(share, 3), "results": results}))


if __name__ == "__main__":
    main()
