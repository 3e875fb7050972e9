"""Preparation throughput: ``distrec data prepare`` against ``pyarrow.csv.read_csv`` on the same files.

The file set is synthetic Criteo-format TSV (``distrec data synth``, distinct seeds) in a
temporary folder: ``--files`` files of ``--rows-per-file`` rows, the last ``--gz-files`` of
them gzip-compressed (level 1), as the Criteo Terabyte days are kept. Each round runs, in a fresh
process each and in turns (the order shuffled per round):

- ``pyarrow_read_csv``: ``pyarrow.csv.read_csv`` of every file, one after the other, with
  Arrow's thread pool on all cores (its default): parsing alone, into Arrow tables;
- ``distrec_prepare``: ``distrec data prepare --data DIR --data-format criteo`` into an empty
  cache folder: listing, parsing, the counts' log transform, the hashes' raw ids and the
  binary cache written to disk, with ``data.prepare_workers`` processes (default: one per core).

Both read the same files, which stay in the page cache after the first round. Throughput is
rows (and input MB, compressed bytes for the .gz files) per second, of the process's wall time
(``wall``: start-up and imports included, ``ratio``) and of the seconds each reports for its
work (``work``: pyarrow's loop over the files, distrec's ``prepare``; ``ratio_work``). Ratios
are distrec's throughput over pyarrow's (medians' ratio; ``*_of_rounds``: the median of the
rounds' ratios). The last line printed is the result JSON, also written to ``--out``.

Usage:
    python benchmarks/data_prepare.py                      # 4 files x 1M rows, 2 of them .gz, 5 rounds
    python benchmarks/data_prepare.py --rows-per-file 2000000 --rounds 3 --workers 2
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import harness

SETUP = {"files": 4, "rows_per_file": 1_000_000, "gz_files": 2, "rounds": 5, "workers": 0, "shuffle_seed": 0}
HELPS = {
    "files": "input files in the set",
    "rows_per_file": "rows of each file",
    "gz_files": "how many of the files (the last ones) are gzip-compressed",
    "rounds": "interleaved rounds; medians are over them",
    "workers": "data.prepare_workers of distrec data prepare (0: its default, one per core)",
    "shuffle_seed": "seed of each round's order of the systems",
}
# pyarrow's multi-threaded CSV reader on each file in turn: the baseline; it prints its seconds after imports, as distrec does
READ_CSV = """
import json, sys, time, pyarrow.csv as pacsv
start = time.perf_counter()
for path in sys.argv[1:]:
    pacsv.read_csv(path, read_options=pacsv.ReadOptions(autogenerate_column_names=True), parse_options=pacsv.ParseOptions(delimiter="\\t"))
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def distrec(*arguments: str) -> list[str]:
    """The command line of ``distrec ARGUMENTS`` with this interpreter."""
    return [sys.executable, "-m", "distrec", *arguments]


def make_files(folder: Path, files: int, rows: int, gz_files: int) -> list[Path]:
    """Write the file set: ``distrec data synth`` TSV files (two at a time), the last
    ``gz_files`` of them then gzip-compressed (level 1, two at a time: quicker to make than
    synth's own .gz, and read as fast); their paths in order."""
    plain = [folder / f"day_{k}.tsv" for k in range(files)]
    running: list[subprocess.Popen] = []
    for k, path in enumerate(plain):
        if len(running) == 2:
            _wait(running.pop(0))
        command = distrec("data", "synth", "-o", str(path), "--rows", str(rows), "--seed", str(1000 + k), "--no-progress")
        running.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in running:
        _wait(p)
    with ThreadPoolExecutor(2) as pool:  # zlib releases the GIL
        compressed = list(pool.map(_gzip, plain[files - gz_files :]))
    return plain[: files - gz_files] + compressed


def _gzip(path: Path) -> Path:
    """``path`` compressed into ``path.gz`` (the plain file removed)."""
    target = path.with_name(path.name + ".gz")
    with open(path, "rb") as source, gzip.open(target, "wb", compresslevel=1) as sink:
        shutil.copyfileobj(source, sink, 1 << 20)
    path.unlink()
    return target


def _wait(process: subprocess.Popen) -> None:
    _, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"distrec data synth failed:\n{err[-2000:]}")


def timed(command: list[str]) -> tuple[float, float]:
    """Seconds of ``command`` in a fresh process (which must succeed): its wall time, and the
    ``seconds`` it reports (its work, without the interpreter's start and imports)."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return wall, float(harness.last_json_line(done.stdout)["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_options(parser, SETUP, HELPS)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-data/data-prepare.json"), help="result JSON")
    args = parser.parse_args()
    setup = {name: getattr(args, name) for name in SETUP}
    with tempfile.TemporaryDirectory(prefix="distrec-bench-prepare-") as tmp:
        folder = Path(tmp) / "criteo"
        folder.mkdir()
        started = time.perf_counter()
        paths = make_files(folder, args.files, args.rows_per_file, args.gz_files)
        print(f"wrote {args.files} files in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        input_bytes = sum(p.stat().st_size for p in paths)
        rows = args.files * args.rows_per_file
        cache = Path(tmp) / "cache"
        prepare = distrec("data", "prepare", "--data-format", "criteo", "--data", str(folder), "--cache-dir", str(cache), "--no-progress")
        if args.workers:
            prepare += ["--set", f"data.prepare_workers={args.workers}"]
        read_csv = [sys.executable, "-c", READ_CSV, *map(str, paths)]

        def run_prepare(_: int) -> tuple[float, float]:
            shutil.rmtree(cache, ignore_errors=True)
            return timed(prepare)

        times = harness.interleaved_rounds(
            {"pyarrow_read_csv": lambda _: timed(read_csv), "distrec_prepare": run_prepare}, args.rounds, shuffle_seed=args.shuffle_seed
        )
        cache_bytes = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    systems, ratios = {}, {}
    for kind, index in (("wall", 0), ("work", 1)):
        seconds = {name: [t[index] for t in values] for name, values in times.items()}
        for name, values in seconds.items():
            samples = harness.Samples(values)
            systems.setdefault(name, {})[kind] = {
                "seconds": samples.summary(3),
                "rows_per_s": round(rows / samples.median),
                "input_mb_per_s": round(input_bytes / 1e6 / samples.median, 1),
            }
        baseline, distrec_seconds = harness.Samples(seconds["pyarrow_read_csv"]).median, harness.Samples(seconds["distrec_prepare"]).median
        per_round = [a / b for a, b in zip(seconds["pyarrow_read_csv"], seconds["distrec_prepare"])]
        ratios[kind] = {"ratio": round(baseline / distrec_seconds, 3), "ratio_of_rounds": round(float(np.median(per_round)), 3)}
    result = {
        "benchmark": "data_prepare",
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.date.today().isoformat(),
        "cpus": len(os.sched_getaffinity(0)),
        "setup": setup,
        "rows": rows,
        "input_bytes": input_bytes,
        "cache_bytes": cache_bytes,
        "commands": {"pyarrow_read_csv": "python -c READ_CSV FILES (see the script)", "distrec_prepare": " ".join(prepare[2:])},
        "systems": systems,
        "ratio": ratios["wall"]["ratio"],
        "ratio_of_rounds": ratios["wall"]["ratio_of_rounds"],
        "ratio_work": ratios["work"]["ratio"],
        "ratio_work_of_rounds": ratios["work"]["ratio_of_rounds"],
    }
    print(
        json.dumps({name: s["wall"]["rows_per_s"] for name, s in systems.items()} | {"ratio": result["ratio"], "ratio_work": result["ratio_work"]}),
        file=sys.stderr,
    )
    harness.finish(result, args.out)


if __name__ == "__main__":
    main()
