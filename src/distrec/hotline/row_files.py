"""A checkpoint's embedding rows on disk: a base file shared between checkpoints, plus the rows changed since.

A table larger than RAM cannot be copied whole at every save: the live table, the previous
checkpoint and the new one would need three times its size on disk. So a checkpoint's rows
are two parts:

- ``hotline-rows.npy``: [num_rows, width], every row as it was when some save wrote this
  file: float32, or int16 for half tables (``distrec.hotline.row_state.RowLayout``: 16-bit
  weights, then each float32 of optimizer state in two elements). Later checkpoints of the
  same run hard-link it (no bytes copied; the file is never written again), so
  ``checkpoint/`` and ``best/`` share one copy.
- ``hotline-rows-changed-ids.npy`` (int64 [n], ascending) and ``hotline-rows-changed.npy``
  ([n, width], the base's dtype): the rows that differ from the base, with their values at this
  save. Absent when the base is this save's own full copy (and in older checkpoints).

The rows of the checkpoint are the base with the changed rows put over it (``SavedRows``:
chunk by chunk, or mapped whole for a model that evaluates without holding the table).
The writer is ``TwoTierStore.save``, which tracks what changed since its base.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distrec.errors import DistrecError

MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" else 0)
"""Map flag: charge no memory for a private map up front (Linux; the constant is in ``mmap`` from Python 3.13)."""

BASE_FILE = "hotline-rows.npy"
CHANGED_IDS_FILE = "hotline-rows-changed-ids.npy"
CHANGED_FILE = "hotline-rows-changed.npy"


@dataclass(frozen=True)
class FileIdentity:
    """What tells one file apart from any other and from its own later versions: device,
    inode, size (bytes) and modification time (ns). Hard links share it."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        s = path.stat()
        return cls(s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)


def find_base(directory: Path, identity: FileIdentity) -> Path | None:
    """The base file with ``identity`` among the checkpoints beside ``directory`` (its
    siblings, where a checkpoint being written next to the earlier ones finds them), if any."""
    for candidate in sorted(directory.parent.glob(f"*/{BASE_FILE}")):
        try:
            if FileIdentity.of(candidate) == identity:
                return candidate
        except OSError:  # removed meanwhile (an old checkpoint being replaced)
            continue
    return None


def link_base(base: Path, directory: Path) -> bool:
    """Hard-link ``base`` as ``directory``'s base file; False when the file system cannot
    (another device, no hard links), so the caller writes a full copy instead."""
    try:
        os.link(base, directory / BASE_FILE)
    except OSError:
        return False
    return True


def write_rows(path: Path, shape: tuple[int, int], chunks: Iterable[np.ndarray], dtype: np.dtype = np.dtype(np.float32)) -> None:
    """Write a ``dtype`` ``.npy`` file of ``shape`` from consecutive row ``chunks`` (``dtype``
    [n, shape[1]] each, together ``shape[0]`` rows), streamed through ``write`` calls: the
    file's pages go through the page cache without being mapped into this process (a map
    would count every written page in its resident memory), then synced."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape})
        written = 0
        for rows in chunks:
            f.write(np.ascontiguousarray(rows, dtype=dtype).data)
            written += rows.shape[0]
        f.flush()
        os.fsync(f.fileno())  # on disk before the checkpoint that names it is complete
    if written != shape[0]:
        raise ValueError(f"{written} rows written to {str(path)!r}, expected {shape[0]}")


def check_size(path: Path, size: int, expected: int) -> None:
    """DistrecError unless the rows file ``path`` has the ``expected`` bytes a map of it covers:
    a shorter file would end the process with SIGBUS ("Bus error") at the first row read past its end."""
    if size != expected:
        raise DistrecError(
            f"the embedding rows file {str(path)!r} has {size} bytes, expected {expected}; it was cut short or changed after it was written: "
            "resume from another checkpoint or retrain"
        )


def map_npy(path: Path) -> np.memmap:
    """The array of the ``.npy`` file ``path`` mapped read-only, after checking that the file
    holds every byte its header describes (``check_size``)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = header(f)
        check_size(path, os.fstat(f.fileno()).st_size, f.tell() + math.prod(shape) * dtype.itemsize)
        return np.memmap(f, dtype, "r", f.tell(), shape, "F" if fortran_order else "C")


class SavedRows:
    """The rows a checkpoint directory holds, read a range at a time or mapped whole (memory stays bounded).

    Args:
        directory: the checkpoint directory.
        dtype: the rows' elements, float32 or int16 (``RowLayout.numpy_unit``): files of
            another dtype are refused (rows of a run with another table dtype).

    Attributes:
        base: the base file, memory-mapped read-only, [num_rows, width] of ``dtype``.
        changed_ids: int64 [n], ascending: the rows that differ from the base.
        changed: [n, width] of ``dtype``, memory-mapped: their values.
    """

    def __init__(self, directory: str | Path, dtype: np.dtype = np.dtype(np.float32)) -> None:
        directory = Path(directory)
        self.base_path = directory / BASE_FILE
        damaged = f"the embedding rows in {str(directory)!r} are damaged; resume from another checkpoint"
        try:
            self.base = map_npy(self.base_path)
            if self.base.ndim != 2:
                raise DistrecError(damaged)
            if self.base.dtype != dtype:
                raise DistrecError(
                    f"the embedding rows in {str(directory)!r} are stored as {self.base.dtype}, not as the {np.dtype(dtype)} of this model's table dtype; "
                    "load them into a model with the table dtype of the run that saved them"
                )
            if (directory / CHANGED_IDS_FILE).is_file():
                self.changed_ids = np.load(directory / CHANGED_IDS_FILE)
                self.changed = map_npy(directory / CHANGED_FILE)
            else:
                self.changed_ids = np.empty(0, np.int64)
                self.changed = np.empty((0, self.base.shape[1]), dtype)
        except (OSError, ValueError) as e:
            raise DistrecError(f"cannot read the embedding rows in {str(directory)!r} ({e}); pass a checkpoint directory of a --hotline run") from None
        if self.changed.shape != (self.changed_ids.size, self.base.shape[1]) or self.changed.dtype != dtype:
            raise DistrecError(damaged)

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, elements per row)."""
        return self.base.shape

    def rows(self, start: int, end: int, width: int | None = None) -> np.ndarray:
        """Rows ``[start, end)``, [end - start, width] (default: every element): the base with
        the changed rows put over it."""
        width = self.base.shape[1] if width is None else width
        rows = np.array(self.base[start:end, :width])
        lo, hi = np.searchsorted(self.changed_ids, [start, end])
        rows[self.changed_ids[lo:hi] - start] = self.changed[lo:hi, :width]
        return rows

    def mapped(self, width: int | None = None) -> np.ndarray:
        """Every row, [num_rows, width] (default: every element), without reading the
        table into memory: a copy-on-write map of the base with the changed rows written over
        it. Pages are read from disk as lookups touch them (the page cache, reclaimable);
        only the pages holding changed rows are copied into private memory (one or two 4 KiB
        pages per changed row at most), and nothing is ever written to the file."""
        width = self.base.shape[1] if width is None else width
        try:
            with open(self.base_path, "rb") as f:  # not np.load(mmap_mode="c"): its map reserves the table's size of memory
                check_size(self.base_path, os.fstat(f.fileno()).st_size, self.base.offset + self.base.nbytes)  # opened anew: it may have changed
                private = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE | MAP_NORESERVE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            raise DistrecError(f"cannot map the embedding rows in {str(self.base_path)!r} ({e}); free memory or address space and retry") from None
        private.madvise(mmap.MADV_RANDOM)  # a lookup faults in its row's page, not the disk's read-ahead window (MBs)
        rows = np.ndarray(self.base.shape, self.base.dtype, buffer=private, offset=self.base.offset)
        rows[self.changed_ids] = self.changed
        return rows[:, :width]
