"""Parsing inputs into their caches: several files, and parts of one file, at the same time.

Each input to prepare is cut into parts: a plain text file into byte ranges holding about
``data.chunk_rows`` rows (the lines that start in each range), a compressed file or a
Parquet file is one part (a compressed stream is read from its start), and so is a
synthetic or MovieLens data set. ``data.prepare_workers`` processes take the parts in
input order and parse them, each writing its rows at their place in the input's cache
files: a part publishes its row, line and value counts in a shared ledger as soon as it is
parsed, and writes once every part before it in its input has published (until then it
holds its parsed rows, about ``chunk_rows`` of them). The first part of an input knows its
place at once and writes as it parses, so a compressed file streams through one chunk of
memory. An input's cache is renamed into place as soon as its last part is written. An
error stops the parts after it and lets the ones before it finish, so the inputs before a
bad one keep their caches, and the error reported is the first one in input order.

Workers are forked: they start at once with the parser already imported, and see what the
parent sees (an in-memory fsspec filesystem, a monkeypatched function in a test). One part
in all, or one worker, runs in this process.
"""

from __future__ import annotations

import errno
import logging
import multiprocessing as mp
import os
import queue
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from distrec.config import DataConfig
from distrec.data.cache_files import CACHE_FORMAT_VERSION, MANIFEST, SKIPPED_FILE, CacheWriter, chunk_bytes
from distrec.data.criteo import load_parsers, read_criteo
from distrec.data.inputs import InputFile, movielens_directory
from distrec.data.movielens import read_movielens
from distrec.data.source import Chunk, MalformedRows, Source
from distrec.data.synthetic import read_synthetic
from distrec.data.tabular import read_tabular
from distrec.data.textfile import BYTES_PER_ROW, ByteRange
from distrec.errors import DistrecError
from distrec.io import atomic_write_json, publish_directory, remove_leftovers

MIN_PART_BYTES = 1 << 20
"""The smallest byte range a plain text file is cut into."""
_POLL_S = 0.002  # how often a part waiting for its place, or the parent waiting for news, looks again
_STOP_TIMEOUT_S = 30.0  # how long stopped workers get to finish their chunk before they are killed

log = logging.getLogger(__name__)


def open_source(cfg: DataConfig, file: InputFile | None = None, byte_range: ByteRange | None = None, strict: bool | None = None) -> Source:
    """The parser for ``cfg.format``: over one input file (or the lines that start in
    ``byte_range`` of it), or over the whole of a synthetic or MovieLens data set."""
    strict = cfg.strict if strict is None else strict
    if cfg.format == "synthetic":
        return read_synthetic(cfg.synthetic, cfg.chunk_rows)
    if cfg.format == "movielens":
        return read_movielens(movielens_directory(cfg), cfg.chunk_rows, strict)
    if file is None:
        raise ValueError(f"format {cfg.format} reads one file at a time")
    if cfg.format == "criteo":
        return read_criteo(file.uri, cfg.chunk_rows, strict, byte_range)
    if cfg.format in ("csv", "parquet"):
        return read_tabular(file.uri, cfg.schema, cfg.format, cfg.chunk_rows, strict, byte_range)
    raise DistrecError(f"unknown data format {cfg.format!r}; choose criteo, movielens, csv, parquet or synthetic")


def default_workers() -> int:
    """One per CPU core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class Part:
    """A piece of preparation work: input ``input`` whole, or the lines starting in ``byte_range``.

    Attributes:
        input: index of the input (into the inputs being prepared).
        index: which part of the input it is (0 for the first).
        first: index of the input's first part among all parts.
        byte_range: the bytes of a plain text file, or None for all of the input.
        size: bytes of input it reads (0 for a generated data set).
    """

    input: int
    index: int
    first: int
    byte_range: ByteRange | None
    size: int


def plan_parts(cfg: DataConfig, inputs: list[InputFile | None]) -> list[Part]:
    """The parts of ``inputs`` in input order (None stands for a synthetic or MovieLens data set)."""
    part_bytes = max(cfg.chunk_rows * BYTES_PER_ROW, MIN_PART_BYTES)
    parts: list[Part] = []
    for i, file in enumerate(inputs):
        first = len(parts)
        if file is None:
            parts.append(Part(i, 0, first, None, 0))
        elif file.compression is not None or cfg.format == "parquet" or file.size <= part_bytes:
            parts.append(Part(i, 0, first, None, file.size))
        else:
            n = -(-file.size // part_bytes)
            bounds = [file.size * k // n for k in range(n + 1)]
            parts += [Part(i, k, first, ByteRange(bounds[k], bounds[k + 1]), bounds[k + 1] - bounds[k]) for k in range(n)]
    return parts


@dataclass
class Counts:
    """What a part (or the parts before one) holds: rows, input lines (rows of Parquet) and
    values per feature."""

    rows: int
    lines: int
    values: list[int]

    @staticmethod
    def zero(num_features: int) -> Counts:
        return Counts(0, 0, [0] * num_features)

    def add(self, other: Counts) -> None:
        self.rows += other.rows
        self.lines += other.lines
        self.values = [a + b for a, b in zip(self.values, other.values)]

    def add_chunk(self, chunk: Chunk) -> None:
        self.rows += chunk.num_rows
        self.values = [n + len(values) for n, (values, _) in zip(self.values, chunk.sparse)]


class _Cancelled(Exception):
    """A part stopped because a part before it in its input, or before it in all, failed."""


class Ledger:
    """What the parts tell each other across processes: which are parsed, their counts, which
    part comes next and from which part on nothing more is done."""

    PENDING, PARSED, FAILED = 0, 1, 2

    def __init__(self, context, num_parts: int, num_features: int) -> None:
        self.width = 2 + num_features
        self._state = context.Array("b", num_parts)
        self._counts = context.Array("q", num_parts * self.width, lock=False)
        self._holders = context.Array("q", num_parts, lock=False)  # the process that took each part
        self._next = context.Value("q", 0)
        self._stop = context.Value("q", num_parts)

    def take(self) -> int | None:
        """The next part to prepare (recorded as this process's), or None when none is left
        (or they are stopped)."""
        with self._next.get_lock():
            k = self._next.value
            if k >= min(self._stop.value, len(self._state)):
                return None
            self._holders[k] = os.getpid()
            self._next.value = k + 1
            return k

    def last_taken_by(self, pid: int) -> int | None:
        """The last part process ``pid`` took (the one it prepares, if it is busy)."""
        with self._next.get_lock():
            taken = [k for k in range(self._next.value) if self._holders[k] == pid]
        return taken[-1] if taken else None

    def publish(self, k: int, counts: Counts) -> None:
        """Part ``k`` is parsed and holds ``counts``."""
        with self._state.get_lock():
            self._counts[k * self.width : (k + 1) * self.width] = [counts.rows, counts.lines, *counts.values]
            self._state[k] = self.PARSED

    def fail(self, k: int) -> None:
        """Part ``k`` failed: the parts after it stop."""
        with self._state.get_lock():
            self._state[k] = self.FAILED
        with self._next.get_lock():
            self._stop.value = min(self._stop.value, k)

    def stop_all(self) -> None:
        with self._next.get_lock():
            self._stop.value = -1

    def check(self, k: int) -> None:
        """Raise _Cancelled when part ``k`` is to stop."""
        if k >= self._stop.value:
            raise _Cancelled

    def counts(self, j: int) -> Counts | None:
        """What part ``j`` holds, or None while it is not parsed; _Cancelled when it failed."""
        with self._state.get_lock():
            state = self._state[j]
            if state == self.FAILED:
                raise _Cancelled
            if state != self.PARSED:
                return None
            rows, lines, *values = self._counts[j * self.width : (j + 1) * self.width]
        return Counts(rows, lines, values)


class _Before:
    """What the parts of an input before part ``k`` hold, summed as they are parsed (each
    looked up once, so a part late in a file of hundreds of parts waits in constant time)."""

    def __init__(self, ledger: Ledger, part: Part, k: int) -> None:
        self.ledger, self.k = ledger, k
        self.next = part.first
        self.total = Counts.zero(ledger.width - 2)

    def known(self) -> Counts | None:
        """The sum once every part before is parsed, else None."""
        while self.next < self.k:
            counts = self.ledger.counts(self.next)
            if counts is None:
                return None
            self.total.add(counts)
            self.next += 1
        return self.total


@dataclass
class PartResult:
    """What a prepared part sends back: its counts, chunks, the input's layout and its skipped
    rows (numbered in the whole input), with ``skipped`` their input positions (int64, ascending;
    ``distrec.data.cache_files.SKIPPED_FILE``)."""

    counts: Counts
    chunks: int
    layout: dict
    malformed: MalformedRows
    skipped: np.ndarray


@dataclass
class Job:
    """What every part needs to know (workers inherit it when forked)."""

    cfg: DataConfig
    inputs: list[InputFile | None]
    staging: list[Path]
    parts: list[Part]
    num_features: int


Progress = Callable[[int, int, int], None]
"""Told each chunk's rows, the input bytes it consumed and the cache bytes it takes."""


def prepare_part(job: Job, k: int, ledger: Ledger, progress: Progress) -> PartResult:
    """Parse part ``k`` and write its rows at their place in its input's cache files."""
    part = job.parts[k]
    first = part.index == 0
    source = open_source(job.cfg, job.inputs[part.input], part.byte_range, strict=job.cfg.strict and first)
    if len(source.features) != job.num_features:
        raise DistrecError(
            f"{source.description.get('path')} has {len(source.features)} categorical features, not {job.num_features}; use one schema for all files"
        )
    own = Counts.zero(job.num_features)
    parts_before = _Before(ledger, part, k)
    before = parts_before.known()
    written = Counts.zero(job.num_features)  # what this part has written so far
    held: list[Chunk] = []
    chunks, consumed = 0, 0
    with CacheWriter(job.staging[part.input], len(source.dense), source.features) as writer:

        def write(chunk: Chunk) -> None:
            writer.write(chunk, before.rows + written.rows, [a + b for a, b in zip(before.values, written.values)])
            written.add_chunk(chunk)

        if first:
            writer.start()
        for chunk in source.chunks:
            ledger.check(k)
            own.add_chunk(chunk)
            chunks += 1
            now = _consumed_bytes(source, part, own.rows)
            progress(chunk.num_rows, now - consumed, chunk_bytes(chunk, len(writer.multi_hot)))
            consumed = now
            held.append(chunk)
            if before is None:
                before = parts_before.known()
            if before is not None:
                for c in held:
                    write(c)
                held = []
        own.lines = source.lines_read() if source.lines_read is not None else own.rows + source.malformed.count
        ledger.publish(k, own)
        while before is None:
            ledger.check(k)
            time.sleep(_POLL_S)
            before = parts_before.known()
        for c in held:
            write(c)
    malformed = MalformedRows(source.malformed.path, job.cfg.strict, source.malformed.unit)
    malformed.merge(source.malformed, before.lines)
    malformed.raise_if_strict()
    layout = {"label": source.label, "dense": source.dense, "features": [f.to_dict() for f in source.features], "source": source.description}
    return PartResult(own, chunks, layout, malformed, malformed.lines() - 1 - source.header_lines)


def _consumed_bytes(source: Source, part: Part, rows: int) -> int:
    """Input bytes of ``part`` the chunks so far consumed (estimated from rows when the parser cannot tell)."""
    if source.fraction_read is not None:
        return int(part.size * source.fraction_read())
    return int(part.size * min(rows / source.num_rows, 1.0)) if source.num_rows else 0


def build(cfg: DataConfig, inputs: list[InputFile | None], targets: list[Path], progress: bool = True) -> None:
    """Prepare each input into the cache directory of the same index in ``targets``.

    Each cache is built under a temporary name and renamed into place when complete; the
    caller holds the targets' locks. Raises the first DistrecError in input order (a
    malformed row with ``cfg.strict``, an input without valid rows, an unreadable file, a
    full disk), after the inputs before it are complete.
    """
    _Build(cfg, inputs, targets, progress).run()


class _Build:
    """One preparation: the parts, their results as they arrive, and the inputs they complete."""

    def __init__(self, cfg: DataConfig, inputs: list[InputFile | None], targets: list[Path], progress: bool) -> None:
        self.cfg = cfg
        self.inputs = inputs
        self.targets = targets
        self.parts = plan_parts(cfg, inputs)
        self.parts_of = [[j for j, p in enumerate(self.parts) if p.input == i] for i in range(len(inputs))]
        self.results: dict[int, PartResult] = {}
        self.errors: dict[int, BaseException] = {}
        self.published: set[int] = set()
        self.rows = self.consumed = self.cache_bytes = 0
        self.total_bytes = sum(p.size for p in self.parts)
        self.total_rows = cfg.synthetic.rows if cfg.format == "synthetic" else None
        self.progress = progress
        self._bar: tqdm | None = None
        self._started = time.perf_counter()

    def run(self) -> None:
        staging = []
        try:
            for target in self.targets:
                remove_leftovers(target)
                staging.append(Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")))
            num_features = len(open_source(self.cfg, self.inputs[0], self.parts[0].byte_range).features)
            job = Job(self.cfg, self.inputs, staging, self.parts, num_features)
            workers = min(self.cfg.prepare_workers or default_workers(), len(self.parts))
            context = mp.get_context("fork")
            ledger = Ledger(context, len(self.parts), num_features)
            with self._progress_bar():
                if workers <= 1:
                    self._run_here(job, ledger)
                else:
                    if self.cfg.format == "criteo":
                        load_parsers()  # once, before the workers fork, rather than in each
                    self._run_workers(job, ledger, context, workers)
        finally:
            for i, path in enumerate(staging):
                if i not in self.published:
                    shutil.rmtree(path, ignore_errors=True)
        if self.errors:
            raise self._error(min(self.errors))

    def _run_here(self, job: Job, ledger: Ledger) -> None:
        for k in range(len(self.parts)):
            if self.errors:
                return
            try:
                result = prepare_part(job, k, ledger, self._advance)
            except Exception as e:
                ledger.fail(k)
                self.errors[k] = e
                return
            self._done(job, k, result)

    def _run_workers(self, job: Job, ledger: Ledger, context, workers: int) -> None:
        events = context.Queue()
        processes = [context.Process(target=_work, args=(job, ledger, events), name=f"distrec-prepare-{w}", daemon=True) for w in range(workers)]
        try:
            for p in processes:
                p.start()
            while True:
                try:
                    event = events.get(timeout=_POLL_S * 25)
                except queue.Empty:
                    if self._died(processes, ledger) or all(p.exitcode is not None for p in processes):
                        return  # after a death the others stop: a killed worker may have left the queue locked
                    continue
                kind, k, *payload = event
                if kind == "progress":
                    self._advance(*payload)
                elif kind == "done":
                    self._done(job, k, payload[0])
                elif kind == "failed":
                    ledger.fail(k)
                    self.errors[k] = payload[0]
                # else cancelled: a part before it failed
        finally:
            ledger.stop_all()  # a no-op when every part is done
            _stop(processes, events)

    def _died(self, processes: list, ledger: Ledger) -> bool:
        """Whether a worker died (killed, out of memory) holding a part, which then fails."""
        held = [(p, ledger.last_taken_by(p.pid)) for p in processes if p.exitcode not in (None, 0)]
        lost = [(p, k) for p, k in held if k is not None and k not in self.results and k not in self.errors]
        if not lost:
            return False
        process, k = lost[0]
        self.errors[k] = DistrecError(
            f"the process preparing {self._name(self.parts[k].input)} died (exit status {process.exitcode}); "
            "if it ran out of memory, lower data.chunk_rows or data.prepare_workers"
        )
        return True

    def _advance(self, rows: int, input_bytes: int, cache_bytes: int) -> None:
        self.rows += rows
        self.consumed += input_bytes
        self.cache_bytes += cache_bytes
        if self._bar is not None:
            self._bar.update(input_bytes if self.total_bytes else rows)
            elapsed = max(time.perf_counter() - self._started, 1e-9)
            self._bar.set_postfix_str(f"{self.rows:,} rows, {self.rows / elapsed:,.0f} rows/s", refresh=False)

    def _done(self, job: Job, k: int, result: PartResult) -> None:
        """Record part ``k``; publish its input's cache when it was the last part."""
        self.results[k] = result
        i = self.parts[k].input
        parts = self.parts_of[i]
        if any(j not in self.results for j in parts):
            return
        try:
            manifest = _manifest([self.results[j] for j in parts], self._name(i))
            np.concatenate([self.results[j].skipped for j in parts]).astype(np.int64).tofile(job.staging[i] / SKIPPED_FILE)
            atomic_write_json(job.staging[i] / MANIFEST, manifest)
            publish_directory(job.staging[i], self.targets[i])
        except (DistrecError, OSError) as e:
            self.errors[parts[-1]] = e
            return
        self.published.add(i)
        if manifest["malformed_rows"]:
            log.warning(MalformedRows.from_manifest(manifest).summary())

    def _error(self, k: int) -> BaseException:
        """The error of part ``k`` as it reaches the user."""
        error = self.errors[k]
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            done = self.consumed / self.total_bytes if self.total_bytes else self.rows / self.total_rows if self.total_rows else 0.0
            needed = f"about {self.cache_bytes / min(done, 1.0) / 1e6:,.1f} MB" if done > 0 else f"more than {self.cache_bytes / 1e6:,.1f} MB"
            what = self._name(0) if len(self.inputs) == 1 else f"{len(self.inputs)} files"
            return DistrecError(
                f"no space left on the disk of {self.targets[0].parent} for the cache of {what}: it needs "
                f"{needed} (the partial caches are removed); free space or pass --cache-dir on a larger disk"
            )
        return error

    def _name(self, i: int) -> str:
        file = self.inputs[i]
        return file.uri if file is not None else str(self.cfg.path or self.cfg.format)

    def _progress_bar(self) -> tqdm:
        names = [self._name(i) for i in range(len(self.inputs))]
        desc = f"preparing {Path(names[0]).name}" if len(names) == 1 else f"preparing {len(names)} files"
        bar = tqdm(
            total=self.total_bytes or self.total_rows,
            unit="B" if self.total_bytes else " rows",
            unit_scale=True,
            unit_divisor=1000,
            desc=desc,
            disable=None if self.progress else True,
        )
        self._bar = bar if not bar.disable else None
        return bar


def _stop(processes: list, events) -> None:
    """Wait for the workers to exit (reading what they still send), killing any that outlive the timeout."""
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while any(p.exitcode is None for p in processes) and time.monotonic() < deadline:
        try:
            events.get(timeout=_POLL_S * 25)
        except queue.Empty:
            pass
    for p in processes:
        if p.exitcode is None:
            p.kill()
        p.join()
    events.close()


def _work(job: Job, ledger: Ledger, events) -> None:
    """A worker process: prepare parts until none is left, reporting to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while (k := ledger.take()) is not None:
        try:
            result = prepare_part(job, k, ledger, lambda *counts, k=k: events.put(("progress", k, *counts)))
        except _Cancelled:
            events.put(("cancelled", k))
            continue
        except Exception as e:
            ledger.fail(k)
            events.put(("failed", k, _transportable(e)))
            continue
        events.put(("done", k, result))


def _transportable(e: Exception) -> Exception:
    """``e`` as it can cross to the parent: DistrecErrors and OSErrors as they are, others with
    their traceback as text (a bug)."""
    if isinstance(e, DistrecError | OSError):
        return e
    return RuntimeError(f"a preparing process failed:\n{traceback.format_exc()}")


def _manifest(results: list[PartResult], name: str) -> dict:
    """The manifest of an input from its parts' results; DistrecError when it has no valid row."""
    total = Counts.zero(len(results[0].counts.values))
    malformed = MalformedRows(results[0].malformed.path, False, results[0].malformed.unit)
    for r in results:
        total.add(r.counts)
        malformed.merge(r.malformed)
    if total.rows == 0:
        skipped = f"; {malformed.summary()}" if malformed.count else ""
        raise DistrecError(f"{name} has no valid rows{skipped}; check --data and --data-format")
    layout = results[0].layout
    return {
        "format_version": CACHE_FORMAT_VERSION,
        "rows": total.rows,
        "chunks": sum(r.chunks for r in results),
        "label": layout["label"],
        "dense": layout["dense"],
        "features": [feature | {"nnz": n} for feature, n in zip(layout["features"], total.values)],
        "source": layout["source"],
        **malformed.to_manifest(),
    }
