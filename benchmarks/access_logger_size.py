"""The access logger's recall of the true top rows versus its memory (the paper's Fig. 27).

Hotline's logger (Adnan et al., ISCA 2024, Sec. V-B) is a 4 MB structure of 2M entries;
distrec's defaults to the same 4 MiB (1M entries of 4 bytes; ``hotline.logger_size``). This
benchmark streams realistic index streams through loggers of several sizes at once (one
pass, ``distrec.hotline.access_logger.measure_recall``) and reports, per size, the recall
of the true top-k rows of the whole stream and the accesses the logger's top k would serve
relative to the true top k's, next to what a logger of unbounded memory would find from the
same sampled mini-batches (its exact counts: the limit the sample rate sets). Among the
sizes is the former default, 4 entries per row of the hot budget (``logger_bytes_for``;
52 bytes a row at 13 bytes an entry then, 16 now).

Streams (``--streams``):
- ``zipf``: ``benchmarks/hotline.py``'s table mix: one table of ``--big-rows`` rows and 25
  of 100 rows, every feature Zipf(1.05), mini-batches of 1024, generated chunk by chunk
  (never all in memory); k = the rows of a 16 MB fast tier of dim-64 rows (hotline.py's),
  of 64 MB and of the default 512 MB of dim-16 rows (SGD, 72 bytes a row).
- ``criteo``: the real Criteo Kaggle sample (``../shared/data``, read in place), its
  training split in mini-batches of 32, reshuffled each of ``--epochs`` epochs (the sample
  is only 3,942 training rows); k = a tenth and half of the rows it touches.
- ``movielens``: the MovieLens-100k sample, 200 mini-batches of 256, as ``distrec bench
  hotline`` streams it; k = a tenth of the rows it touches (295: the recall of 0.78 at a 5%
  sample rate in benchmarks/results/2026-11-25-hotline-access-logger.md).

Prints a table per stream; the last line is the harness's result record: the recall of the
default logger and of the unbounded one (one value per stream and k), and for every stream
and k the figures at the default size and at the former default's (``--out`` also gets every size in
``access-logger-size.json``, and ``access-logger-size.png``).

Usage:
    python benchmarks/access_logger_size.py                     # ~5 minutes on 2 busy cores
    python benchmarks/access_logger_size.py --streams criteo movielens --epochs 4   # ~1 minute
    python benchmarks/access_logger_size.py --streams zipf --zipf-batches 8000 --sample-rate 1 \
        --sizes 1MiB 4MiB 16MiB 64MiB     # a sample touching more rows than 4 MiB has entries
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import harness
from distrec.config import DataConfig, SyntheticConfig
from distrec.data import Dataset, prepare
from distrec.data.synthetic import SyntheticGenerator
from distrec.figures import save_figure
from distrec.hotline.access_logger import DEFAULT_LOGGER_BYTES, logger_bytes_for, measure_recall
from distrec.hotline.hot_set import hot_row_bytes
from distrec.hotline.measure import batch_ids, logger_size_figure
from distrec.hotline.rows import RowSpace
from distrec.io import atomic_write_json
from distrec.units import parse_bytes

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SIZES = [16 << 10, 64 << 10, 256 << 10, 1 << 20, DEFAULT_LOGGER_BYTES, 16 << 20, 64 << 20]
ZIPF_BUDGETS = [("16MB", 64), ("64MB", 16), ("512MB", 16)]  # (fast tier, dim): hotline.py's, and dim-16 rows
SMALL_ROWS, SMALL_TABLES, ZIPF_BATCH = 100, 25, 1024
CHUNK_BATCHES = 64


def zipf_stream(big_rows: int, batches: int, seed: int) -> tuple[int, Iterator[np.ndarray]]:
    """(total rows, mini-batches of global ids) of hotline.py's table mix, generated lazily."""
    rows = batches * ZIPF_BATCH
    big = SyntheticGenerator(SyntheticConfig(rows, 0, 1, big_rows, 1.05, seed=seed))
    small = SyntheticGenerator(SyntheticConfig(rows, 0, SMALL_TABLES, SMALL_ROWS, 1.05, seed=seed + 1))
    offsets = big_rows + SMALL_ROWS * np.arange(SMALL_TABLES)  # the small tables follow the big one

    def batches_of() -> Iterator[np.ndarray]:
        for start in range(0, rows, CHUNK_BATCHES * ZIPF_BATCH):
            n = min(CHUNK_BATCHES * ZIPF_BATCH, rows - start)
            big_ids = big.generate(start, n).sparse[0][0].reshape(-1, ZIPF_BATCH)
            small_ids = np.stack([ids for ids, _ in small.generate(start, n).sparse])  # [tables, n]
            small_ids = (small_ids + offsets[:, None]).reshape(SMALL_TABLES, -1, ZIPF_BATCH).transpose(1, 0, 2)
            yield from np.concatenate([big_ids[:, None, :], small_ids], axis=1).reshape(big_ids.shape[0], -1)

    return big_rows + SMALL_ROWS * SMALL_TABLES, batches_of()


def real_stream(fmt: str, path: Path, batch_size: int, epochs: int, max_batches: int | None, cache: Path, seed: int) -> tuple[int, list[np.ndarray]]:
    """(total rows, mini-batches of global ids) of a real sample's training split, reshuffled every epoch."""
    cfg = DataConfig(path=str(path), format=fmt)
    dataset = Dataset(prepare(cfg, cache_root=cache, progress=False), cfg)
    rows = dataset.split(cfg.split, seed=seed)["train"]
    space = RowSpace.from_tables(dataset.tables(16))
    stream = []
    for epoch in range(epochs):
        stream += batch_ids(list(dataset.batches(rows, batch_size, shuffle=True, seed=seed + epoch))[:max_batches], space)
    return space.total_rows, stream


def table(results: list[dict]) -> str:
    lines = ["| k | logger | entries | recall | unbounded recall | access coverage | unbounded coverage |", "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["k"], r["logger_bytes"])):
        lines.append(
            f"| {r['k']:,} | {r['logger_bytes'] / 2**20:.3g} MiB | {r['entries']:,} | {r['recall']:.3f} | {r['unbounded_recall']:.3f} | "
            f"{r['access_coverage']:.3f} | {r['unbounded_access_coverage']:.3f} |"
        )
    return "\n".join(lines)


def summarise(results: list[dict], k: int) -> dict:
    """Recall and access coverage of the top ``k`` at the default size and at the former default's entries."""
    rows = {r["capacity_bytes"]: r for r in results if r["k"] == k}
    keep = ("logger_bytes", "entries", "recall", "access_coverage", "unbounded_recall", "unbounded_access_coverage")
    sizes = (("default", DEFAULT_LOGGER_BYTES), ("former_default", logger_bytes_for(k)))
    return {"k": k, **{name: {f: rows[size][f] for f in keep} for name, size in sizes if size in rows}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", nargs="+", default=["zipf", "criteo", "movielens"], choices=["zipf", "criteo", "movielens"])
    p.add_argument("--big-rows", type=int, default=8_000_000, help="rows of the Zipf stream's large table")
    p.add_argument("--zipf-batches", type=int, default=4000, help="mini-batches of the Zipf stream (hotline.py learns from 200 sampled: 4000 at 5%%)")
    p.add_argument("--epochs", type=int, default=10, help="passes over the Criteo sample")
    p.add_argument("--sample-rate", type=float, default=0.05)
    p.add_argument("--sizes", nargs="+", help="logger sizes, e.g. 1MiB 4MiB (default: 16 KiB to 64 MiB by 4x, and the former default per k)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", type=Path, default=Path("runs/bench-access-logger-size"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.out / "data-cache"
    result: dict = {"sample_rate": args.sample_rate, "default_logger_bytes": DEFAULT_LOGGER_BYTES, "streams": {}}
    for name in args.streams:
        started = time.perf_counter()
        if name == "zipf":
            total_rows, stream = zipf_stream(args.big_rows, args.zipf_batches, args.seed)
            ks = [parse_bytes(budget, "budget") // hot_row_bytes(dim) for budget, dim in ZIPF_BUDGETS]
            title = f"Zipf(1.05): 1 x {args.big_rows:,} + 25 x 100 rows, {args.zipf_batches} batches of {ZIPF_BATCH}"
        else:
            spec = {"criteo": ("criteo", DATA / "criteo" / "criteo_kaggle_sample.tsv", 32, args.epochs, None),
                    "movielens": ("movielens", DATA / "movielens", 256, 1, 200)}[name]  # fmt: skip
            total_rows, stream = real_stream(*spec, cache, args.seed)
            distinct = np.unique(np.concatenate(stream)).size
            ks = [distinct // 10] + ([distinct // 2] if name == "criteo" else [])
            title = f"{name} sample: {len(stream)} batches of {spec[2]} ({distinct:,} rows touched)"
        sizes = sorted({*(parse_bytes(x, "--sizes") for x in args.sizes)}) if args.sizes else sorted({*SIZES, *(logger_bytes_for(k) for k in ks)})
        results = measure_recall(stream, total_rows, ks, sizes, [args.sample_rate], seed=args.seed)
        seconds = time.perf_counter() - started
        print(f"\n{title} (sample rate {args.sample_rate:g}, {results[0]['sampled_batches']} batches sampled, {seconds:.0f} s)\n{table(results)}", flush=True)
        result["streams"][name] = {
            "title": title,
            "total_rows": total_rows,
            "ks": ks,
            "former_default_bytes": {k: logger_bytes_for(k) for k in ks},
            "results": results,
        }
    fig = logger_size_figure({s["title"]: s["results"] for s in result["streams"].values()}, {"4 MiB default (paper: 4 MB)": DEFAULT_LOGGER_BYTES})
    save_figure(fig, args.out / "access-logger-size.png")
    atomic_write_json(args.out / "access-logger-size.json", result)
    summary = {name: [summarise(s["results"], k) for k in s["ks"]] for name, s in result["streams"].items()}
    cases = [(name, row) for name, rows in summary.items() for row in rows if "default" in row]
    at_default = [row["default"] for _, row in cases]
    systems = [
        harness.SystemResult(
            logger,
            "recall of the true top k",
            "fraction",
            harness.Samples([r[key] for r in at_default]),
            extra={"cases": [f"{n} top {row['k']}" for n, row in cases]},
        )
        for logger, key in (("4 MiB default logger", "recall"), ("unbounded logger", "unbounded_recall"))
    ]
    extra = {
        "sample_rate": args.sample_rate,
        "default_logger_bytes": DEFAULT_LOGGER_BYTES,
        "streams": summary,
        "min_recall_at_default": min((r["recall"] for r in at_default), default=None),
        "max_recall_shortfall_at_default": max((r["unbounded_recall"] - r["recall"] for r in at_default), default=None),
    }
    harness.finish(harness.ResultRecord("access_logger_size", systems, None, extra))


if __name__ == "__main__":
    main()
