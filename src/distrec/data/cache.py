"""The columnar binary cache: parse an input once, then memory-map it for every run.

A cache directory holds::

    manifest.json        format version, rows, chunks, label / dense / feature names, source,
                         malformed row count and the first few line numbers
    dense.f32            float32 [rows, n_dense], row-major
    labels.f32           float32 [rows]
    sparse_<f>.ids.i64   int64 [nnz] raw ids of feature f (0 = missing)
    sparse_<f>.offsets.i64  int64 [rows + 1] bag boundaries (multi-hot features only)

It is written chunk by chunk (memory bounded by one chunk) into a temporary directory
that is renamed into place when complete, so a directory under its final name is always
whole. Its name is a hash of the input's identity (absolute path, size and modification
time, format, schema text, synthetic parameters), so a changed input gets a new cache.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from distrec.config import DataConfig
from distrec.data.criteo import read_criteo
from distrec.data.fingerprint import input_files
from distrec.data.movielens import read_movielens
from distrec.data.source import Chunk, MalformedRows, Source, existing_path
from distrec.data.synthetic import read_synthetic
from distrec.data.tabular import read_tabular
from distrec.errors import DistrecError
from distrec.io import atomic_directory, atomic_write_json

# Bump when the layout or any parser's output changes: old caches are then not reused.
CACHE_FORMAT_VERSION = 2
MANIFEST = "manifest.json"
DENSE_FILE = "dense.f32"
LABELS_FILE = "labels.f32"

log = logging.getLogger(__name__)


def ids_file(feature: int) -> str:
    return f"sparse_{feature}.ids.i64"


def offsets_file(feature: int) -> str:
    return f"sparse_{feature}.offsets.i64"


def default_cache_root(cfg: DataConfig) -> Path:
    """``cfg.cache_dir``, else ``$DISTREC_CACHE``, else ``~/.cache/distrec``."""
    root = cfg.cache_dir or os.environ.get("DISTREC_CACHE") or Path.home() / ".cache" / "distrec"
    return Path(root).expanduser()


def open_source(cfg: DataConfig) -> Source:
    """The parser for ``cfg.format`` over ``cfg.path``."""
    if cfg.format == "synthetic":
        return read_synthetic(cfg.synthetic, cfg.chunk_rows)
    if cfg.format == "criteo":
        return read_criteo(cfg.path, cfg.chunk_rows, cfg.strict)
    if cfg.format == "movielens":
        return read_movielens(cfg.path, cfg.chunk_rows, cfg.strict)
    if cfg.format in ("csv", "parquet"):
        return read_tabular(cfg.path, cfg.schema, cfg.format, cfg.chunk_rows, cfg.strict)
    raise DistrecError(f"unknown data format {cfg.format!r}; choose criteo, movielens, csv, parquet or synthetic")


def _identity(cfg: DataConfig) -> tuple[str, dict]:
    """A readable name for the input and everything that determines its parsed rows.

    Raises DistrecError when the input or the schema is missing.
    """
    if cfg.format == "synthetic":
        if cfg.path is not None:
            raise DistrecError(
                "--data-format synthetic generates its data; drop --data, or read a file written by `distrec data synth` with --data-format criteo"
            )
        return f"{cfg.synthetic.rows}rows", {"synthetic": dataclasses.asdict(cfg.synthetic)}
    if cfg.path is None:
        raise DistrecError(f"--data-format {cfg.format} needs --data PATH")
    identity = {}
    if cfg.format in ("csv", "parquet"):
        if cfg.schema is None:
            raise DistrecError(f"--data-format {cfg.format} needs --schema FILE naming the label, dense and categorical columns")
        identity["schema"] = existing_path(cfg.schema, what="schema").read_text(errors="replace")
    identity["files"] = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in input_files(cfg)]
    return Path(cfg.path).name, identity


def cache_name(cfg: DataConfig) -> str:
    """The cache directory name for ``cfg``'s input: a readable prefix and a hash of its identity."""
    stem, identity = _identity(cfg)
    identity |= {"version": CACHE_FORMAT_VERSION, "format": cfg.format}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{cfg.format}-{re.sub(r'[^A-Za-z0-9._-]', '_', stem)[:40]}-{digest}"


def prepare(cfg: DataConfig, cache_root: str | Path | None = None, progress: bool = True) -> Path:
    """Parse ``cfg``'s input into a cache directory (or reuse a complete one) and return it.

    A complete cache is read without locking or writing anything, so a read-only cache
    directory works once it holds the cache. Building one takes an exclusive lock and
    first removes temporaries left by a prepare that was killed.

    Args:
        cfg: the data section (format, path, schema, strict, chunk_rows, synthetic).
        cache_root: where caches live (default :func:`default_cache_root`).
        progress: show a rows/s progress bar (only on a terminal).

    Raises:
        DistrecError: missing input or schema, a malformed row with ``cfg.strict``, no
            valid rows at all, a cache directory that cannot be written, or a full disk.
    """
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root(cfg)
    target = root / cache_name(cfg)
    if _reuse(target, cfg.strict):
        return target
    with _locked(root / f".{target.name}.lock", cfg):
        if _reuse(target, cfg.strict):  # another process prepared it while we waited
            return target
        source = open_source(cfg)
        with atomic_directory(target) as tmp:
            write_cache(source, tmp, progress)
        if source.malformed.count:
            log.warning(source.malformed.summary())
    return target


def _reuse(target: Path, strict: bool) -> bool:
    """Whether ``target`` is a complete cache of this format (its skipped rows reported again).

    A directory under its final name is always whole (it is renamed into place when
    complete), so no lock is needed to read it.
    """
    if not (target / MANIFEST).is_file():
        return False
    manifest = read_manifest(target)
    if manifest.get("format_version") != CACHE_FORMAT_VERSION:
        return False
    malformed = MalformedRows.from_manifest(manifest, strict)
    # strict mode over a cache made in lenient mode fails as parsing would have
    malformed.raise_if_strict()
    if malformed.count:
        log.warning(f"{malformed.summary()} (when the cache {target.name} was prepared)")
    return True


@contextmanager
def _locked(path: Path, cfg: DataConfig) -> Iterator[None]:
    """An exclusive advisory lock, so concurrent processes prepare a cache only once."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "w")
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise DistrecError(
            f"cache directory {path.parent} is not writable ({e.strerror}) and holds no complete cache of "
            f"{cfg.path or cfg.format}; pass a writable --cache-dir (or set DISTREC_CACHE)"
        ) from None
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_cache(source: Source, directory: Path, progress: bool = True) -> dict:
    """Stream ``source`` into the cache files under ``directory``; write and return the manifest.

    Raises DistrecError if the source has no valid row, or when the disk fills up (naming
    the directory and an estimate of the space the whole cache needs).
    """
    written = _Written()
    try:
        return _write_cache(source, directory, progress, written)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        name = source.description.get("path") or source.description["format"]
        raise DistrecError(
            f"no space left on the disk of {directory.parent} for the cache of {name}: it needs "
            f"{written.estimate(source)} (the partial cache is removed); free space or pass --cache-dir on a larger disk"
        ) from None


@dataclasses.dataclass
class _Written:
    """Rows handed to the cache files so far (including the chunk being written) and their bytes."""

    rows: int = 0
    bytes: int = 0

    def add(self, chunk: Chunk, multi_hot: int) -> None:
        self.rows += chunk.num_rows
        self.bytes += 4 * chunk.dense.size + 4 * chunk.num_rows + 8 * sum(len(values) for values, _ in chunk.sparse)
        self.bytes += 8 * multi_hot * chunk.num_rows

    def estimate(self, source: Source) -> str:
        """The size of the whole cache, extrapolated from the rows so far."""
        if source.num_rows:
            done = self.rows / source.num_rows
        else:
            done = source.fraction_read() if source.fraction_read is not None else 0.0
        if not self.rows or done <= 0:
            return f"more than {self.bytes / 1e6:,.1f} MB"
        return f"about {self.bytes / min(done, 1.0) / 1e6:,.1f} MB"


def _write_cache(source: Source, directory: Path, progress: bool, written: _Written) -> dict:
    rows = chunks = 0
    nnz = [0] * len(source.features)
    name = source.description.get("path") or source.description["format"]
    with ExitStack() as stack:
        dense = stack.enter_context(open(directory / DENSE_FILE, "wb"))
        labels = stack.enter_context(open(directory / LABELS_FILE, "wb"))
        ids = [stack.enter_context(open(directory / ids_file(f), "wb")) for f in range(len(source.features))]
        offsets = {f: stack.enter_context(open(directory / offsets_file(f), "wb")) for f, feat in enumerate(source.features) if feat.multi_hot}
        for out in offsets.values():
            out.write(np.zeros(1, np.int64))
        bar = stack.enter_context(
            tqdm(total=source.num_rows, unit=" rows", unit_scale=True, desc=f"preparing {Path(name).name}", disable=None if progress else True)
        )
        for chunk in source.chunks:
            written.add(chunk, len(offsets))
            dense.write(np.ascontiguousarray(chunk.dense, np.float32))
            labels.write(np.ascontiguousarray(chunk.labels, np.float32))
            for f, (values, lengths) in enumerate(chunk.sparse):
                ids[f].write(np.ascontiguousarray(values, np.int64))
                if f in offsets:
                    offsets[f].write(nnz[f] + np.cumsum(lengths, dtype=np.int64))
                nnz[f] += len(values)
            rows += chunk.num_rows
            chunks += 1
            bar.update(chunk.num_rows)
    if rows == 0:
        skipped = f"; {source.malformed.summary()}" if source.malformed.count else ""
        raise DistrecError(f"{name} has no valid rows{skipped}; check --data and --data-format")
    manifest = {
        "format_version": CACHE_FORMAT_VERSION,
        "rows": rows,
        "chunks": chunks,
        "label": source.label,
        "dense": source.dense,
        "features": [feat.to_dict() | {"nnz": nnz[f]} for f, feat in enumerate(source.features)],
        "source": source.description,
        **source.malformed.to_manifest(),
    }
    atomic_write_json(directory / MANIFEST, manifest)
    return manifest


def read_manifest(directory: str | Path) -> dict:
    """The manifest of a cache directory (DistrecError if it is not a cache)."""
    path = Path(directory) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise DistrecError(f"{directory} is not a distrec data cache (no readable {MANIFEST}); run distrec data prepare") from None
