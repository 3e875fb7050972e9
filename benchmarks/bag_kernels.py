"""Multi-hot lookup and grouping by row: the bag kernels against the torch operators.

For one batch of feature-major multi-hot bags (every table its own feature), times in the
same process, alternating in rounds:

- lookup: ``distrec.kernels.bags.pool`` (sample-major [B * F, D] straight from the batch)
  against the torch path (``feature_major`` rows, ``embedding_bag``, transpose to [B, F, D]);
- grouping: ``distrec.kernels.bags.group`` against ``group_by_row`` of all rows plus the bag
  of each sorted entry (what the backward hands the row update);
- row-wise Adagrad update of the grouped rows: ``distrec.kernels.row_updates`` (one pass per
  row) against torch operators (each row's entries summed by ``embedding_bag``, then the
  accumulator and the weight updated with ``index_add_``).

Lookup and grouping give bit-for-bit the same results, the update the same to rounding (its
row norms add their squares in another order); all three are checked here too. Medians in ms;
the last line is the harness's result record (one system per part, thread count and
implementation, its time per round), with ``results``: per part and thread count both medians
and the speed-up.

Usage:
    python benchmarks/bag_kernels.py                                # 26 x 100,000 x 64, 20 per bag
    python benchmarks/bag_kernels.py --pooling-factor 1 --threads 1 2
    python benchmarks/bag_kernels.py --distribution zipf              # Zipf 1.05 ranks, shuffled rows
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import harness
from distrec.data.synthetic import ZipfSampler
from distrec.kernels import bags as kernels
from distrec.kernels import row_updates
from distrec.models.embedding import feature_major, group_by_row
from vs_torchrec import ZIPF_EXPONENT


def make_batch(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Feature-major bags of ``pooling_factor`` indices, uniform or Zipf (each table's popular
    rows scattered over it): values, offsets, table bases, table rows, weight."""
    g = torch.Generator().manual_seed(args.seed)
    bags = args.tables * args.batch
    if args.distribution == "zipf":
        rng = np.random.default_rng(args.seed)
        ranks = ZipfSampler(args.rows, ZIPF_EXPONENT).ranks(rng.random((args.tables, args.batch * args.pooling_factor)))
        values = torch.from_numpy(np.concatenate([rng.permutation(args.rows)[r] for r in ranks]))
    else:
        values = torch.randint(0, args.rows, (bags * args.pooling_factor,), generator=g)
    offsets = torch.arange(0, bags * args.pooling_factor + 1, args.pooling_factor)
    num_rows = torch.full((args.tables,), args.rows, dtype=torch.int64)
    weight = torch.rand(args.tables * args.rows, args.dim, generator=g)
    return values, offsets, torch.arange(args.tables) * args.rows, num_rows, weight


def batch_parser(description: str, rounds: int, repeats: int) -> argparse.ArgumentParser:
    """The options of ``make_batch``'s batch and of the timing (rounds, calls per measurement, threads)."""
    p = argparse.ArgumentParser(description=description.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--rows", type=int, default=100_000, help="rows per table")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=2048, help="samples")
    p.add_argument("--pooling-factor", type=int, default=20, help="indices per bag")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--repeats", type=int, default=repeats, help="calls per measurement (median)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> dict:
    p = batch_parser(__doc__, rounds=3, repeats=7)
    p.add_argument("--distribution", choices=["uniform", "zipf"], default="uniform", help=f"indices of each table (zipf: exponent {ZIPF_EXPONENT})")
    args = p.parse_args(argv)
    values, offsets, base, num_rows, weight = make_batch(args)
    segments = kernels.feature_segments(values, offsets, base, num_rows)
    shape = (args.tables, args.batch, args.dim)

    def torch_lookup() -> torch.Tensor:
        bags = feature_major(values, offsets, base)
        pooled = F.embedding_bag(bags.rows, weight, bags.offsets, mode="sum", include_last_offset=True)
        return pooled.view(shape).transpose(0, 1).contiguous()

    def torch_grouping() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bags = feature_major(values, offsets, base)
        rows, bounds, order = group_by_row(bags.rows, weight.shape[0])
        bag = order if bags.bag_of_row is None else bags.bag_of_row[order]  # None: one row per bag
        return rows, bounds, (bag % args.batch) * args.tables + bag // args.batch  # output row of bag f * B + b

    if not torch.equal(kernels.pool(weight, segments).view(args.batch, args.tables, args.dim), torch_lookup()):
        raise SystemExit("bag_kernels: the kernel's lookup differs from the torch operators'")
    if not all(torch.equal(a, b) for a, b in zip(kernels.group(segments), torch_grouping())):
        raise SystemExit("bag_kernels: the kernel's grouping differs from the torch operators'")
    rows, bounds, picks = kernels.group(segments)
    grad = torch.randn(args.batch * args.tables, args.dim, generator=torch.Generator().manual_seed(args.seed + 1))
    accumulator = torch.zeros(weight.shape[0])
    lr, eps = 1e-9, 1e-10  # tiny steps: repeated calls leave the weight almost as it was

    def torch_update() -> None:
        summed = F.embedding_bag(picks, grad, bounds, mode="sum", include_last_offset=True)
        accumulator.index_add_(0, rows, summed.square().mean(1))
        weight.index_add_(0, rows, summed / (accumulator[rows].sqrt() + eps).unsqueeze(1), alpha=-lr)

    def kernel_update() -> None:
        row_updates.rowwise_adagrad_rows(weight, accumulator, rows, bounds, picks, grad, lr, eps)

    start_weight, start_accumulator = weight.clone(), accumulator.clone()
    torch_update()
    want_weight, want_accumulator = weight.clone(), accumulator.clone()
    weight.copy_(start_weight), accumulator.copy_(start_accumulator)
    kernel_update()
    if not (torch.allclose(weight, want_weight) and torch.allclose(accumulator, want_accumulator, rtol=1e-5)):
        raise SystemExit("bag_kernels: the kernel's row update differs from the torch operators'")
    cases = {
        "lookup": (torch_lookup, lambda threads: kernels.pool(weight, segments, threads)),
        "grouping": (torch_grouping, lambda threads: kernels.group(segments, threads)),
        "update": (torch_update, lambda threads: kernel_update()),  # threads: torch.set_num_threads below
    }

    def timed(fn, threads: int):
        def run(r: int) -> float:
            torch.set_num_threads(threads)
            return harness.median_ms(fn, args.repeats)

        return run

    systems = {
        f"{name}, {threads} threads, {impl}": timed(reference if impl == "torch" else lambda threads=threads, kernel=kernel: kernel(threads), threads)
        for threads in args.threads
        for name, (reference, kernel) in cases.items()
        for impl in ("torch", "kernels")
    }
    times = harness.interleaved_rounds(systems, args.rounds, after_round=lambda r: print(f"round {r + 1}/{args.rounds} done", flush=True))
    results = []
    print(f"\n{'part':9s} {'threads':>7s} {'torch ms':>9s} {'kernels ms':>10s} {'speed-up':>8s}")
    for threads in args.threads:
        for name in cases:
            ref = harness.Samples(times[f"{name}, {threads} threads, torch"]).median
            new = harness.Samples(times[f"{name}, {threads} threads, kernels"]).median
            results.append({"part": name, "threads": threads, "torch_ms": round(ref, 2), "kernels_ms": round(new, 2), "speedup": round(ref / new, 2)})
            print(f"{name:9s} {threads:7d} {ref:9.2f} {new:10.2f} {ref / new:8.2f}")
    measured = [harness.SystemResult(name, "time per call (median of the round's calls)", "ms", harness.Samples(t)) for name, t in times.items()]
    return harness.finish(harness.ResultRecord("bag_kernels", measured, None, {"config": vars(args), "results": results}))


if __name__ == "__main__":
    main()
