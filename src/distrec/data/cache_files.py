"""The files of a prepared cache directory, and writing rows at their place in them.

A file's cache directory holds::

    manifest.json        format version, rows, chunks, label / dense / feature names, source,
                         malformed row count and the first few line numbers
    dense.f32            float32 [rows, n_dense], row-major
    labels.f32           float32 [rows]
    sparse_<f>.ids.i64   int64 [nnz] raw ids of feature f (0 = missing)
    sparse_<f>.offsets.i64  int64 [rows + 1] bag boundaries (multi-hot features only)
    skipped.i64          int64 [malformed rows] the input positions of the skipped rows,
                         ascending (0-based over the input's data rows, a header line excluded)

A data set of several files is a set directory holding only a manifest whose ``parts``
name the files' cache directories beside it, in file order (:func:`part_directories`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from distrec.data.source import Chunk, SparseFeature
from distrec.errors import DistrecError

# Bump when the layout or any parser's output changes: old caches are then not reused.
CACHE_FORMAT_VERSION = 2
MANIFEST = "manifest.json"
DENSE_FILE = "dense.f32"
LABELS_FILE = "labels.f32"
SKIPPED_FILE = "skipped.i64"
"""Absent from caches of distrec versions before it: ``distrec.data.cache`` prepares such a
cache again when it skipped rows (it needs no record when it skipped none)."""
PARTS = "parts"
"""The manifest key of a set: the names of its files' cache directories, in file order."""


def ids_file(feature: int) -> str:
    return f"sparse_{feature}.ids.i64"


def offsets_file(feature: int) -> str:
    return f"sparse_{feature}.offsets.i64"


def read_manifest(directory: str | Path) -> dict:
    """The manifest of a cache directory (DistrecError if it is not a cache)."""
    path = Path(directory) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise DistrecError(f"{directory} is not a distrec data cache (no readable {MANIFEST}); run distrec data prepare") from None


def part_directories(directory: str | Path) -> list[Path]:
    """The cache directories of the files of a cache: its parts for a set, else itself."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    return [directory.parent / name for name in manifest[PARTS]] if PARTS in manifest else [directory]


def chunk_bytes(chunk: Chunk, multi_hot: int) -> int:
    """Bytes ``chunk`` takes in a cache with ``multi_hot`` multi-hot features."""
    return 4 * chunk.dense.size + 4 * chunk.num_rows + 8 * sum(len(values) for values, _ in chunk.sparse) + 8 * multi_hot * chunk.num_rows


class CacheWriter:
    """Writes chunks into the column files of one cache directory, each at the rows and
    values it is given, so that parts of an input can be written in any order (and by several
    processes: each opens its own writer)."""

    def __init__(self, directory: Path, num_dense: int, features: list[SparseFeature]) -> None:
        self.num_dense = num_dense
        self.multi_hot = [f for f, feat in enumerate(features) if feat.multi_hot]
        flags = os.O_WRONLY | os.O_CREAT
        self._dense = os.open(directory / DENSE_FILE, flags, 0o644)
        self._labels = os.open(directory / LABELS_FILE, flags, 0o644)
        self._ids = [os.open(directory / ids_file(f), flags, 0o644) for f in range(len(features))]
        self._offsets = {f: os.open(directory / offsets_file(f), flags, 0o644) for f in self.multi_hot}

    def write(self, chunk: Chunk, rows_before: int, values_before: list[int]) -> None:
        """Write ``chunk`` as rows ``rows_before`` on, feature f's values from ``values_before[f]`` on."""
        write_at(self._dense, np.ascontiguousarray(chunk.dense, np.float32), 4 * self.num_dense * rows_before)
        write_at(self._labels, np.ascontiguousarray(chunk.labels, np.float32), 4 * rows_before)
        for f, (values, lengths) in enumerate(chunk.sparse):
            write_at(self._ids[f], np.ascontiguousarray(values, np.int64), 8 * values_before[f])
            if f in self._offsets:
                write_at(self._offsets[f], values_before[f] + np.cumsum(lengths, dtype=np.int64), 8 * (rows_before + 1))

    def start(self) -> None:
        """Write the leading 0 of every offsets file (by the writer of an input's first part)."""
        for fd in self._offsets.values():
            write_at(fd, np.zeros(1, np.int64), 0)

    def close(self) -> None:
        for fd in [self._dense, self._labels, *self._ids, *self._offsets.values()]:
            os.close(fd)

    def __enter__(self) -> CacheWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_at(fd: int, array: np.ndarray, offset: int) -> None:
    """Write the bytes of a contiguous array at byte ``offset`` of an open file, whole."""
    if array.nbytes == 0:  # e.g. no dense columns: a view with a zero in its shape cannot be cast
        return
    view = memoryview(array).cast("B")
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
