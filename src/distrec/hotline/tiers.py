"""Two-tier embedding storage: hot rows in a small fast tier, every other row in a big slow tier.

The slow tier is the whole fused table (all tables, global row ids, see ``rows.py``), row
``i`` at position ``i``: a memory-mapped scratch file on disk when the model runs on the
host (so tables larger than RAM still train; the page cache holds what fits), or host
memory, pinned, when the model runs on an accelerator. The fast tier is a compact tensor of
the hot rows on the model's device, ``fast[j]`` (slot j) holding row ``hot_ids[j]``
(ascending). A slot map, int32 per row in host memory (4 bytes per row, 1/dim of the table's
own bytes at most), gives each row's slot or -1, so finding the tier of a batch's rows is one
gather instead of a binary search per lookup.

Every row lives in exactly one tier: a hot row's slow-tier slot is stale and is never read
or updated until the row leaves the hot set, when its fast copy is written back. So
updates need no coherence copies and moving rows between tiers loses none.

A gather from the disk tier first starts the reads of every page its rows touch, together
(``readahead.py``), instead of faulting them in one at a time.

A stored row is ``width`` elements of the store's ``dtype``: the ``dim`` embedding weights
first, then the optimizer's per-row state, so both move between tiers together
(``distrec.hotline.row_state.RowLayout``: float32 elements for a float32 table, 16-bit ones
for a half table, whose disk tier and fast tier then take about half the bytes). The store
only moves rows; what they hold is its caller's.

Checkpoints (``save``/``load``) use ``row_files``' layout: the store remembers which base
file its rows were last saved to or loaded from and which rows it has written since, so a
save next to that base hard-links it and writes only the changed rows.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from distrec.allocator import empty_table
from distrec.errors import DistrecError
from distrec.hotline.readahead import RowReadahead
from distrec.hotline.row_files import BASE_FILE, CHANGED_FILE, CHANGED_IDS_FILE, FileIdentity, SavedRows, find_base, link_base, write_rows
from distrec.hotline.rows import find_sorted
from distrec.io import atomic_path

FLOAT_BYTES = 4
CHUNK_BYTES = 64 << 20  # rows are initialised, saved and loaded in chunks of about this many bytes
SLOW_TIERS = ("auto", "disk", "host")

RowInit = Callable[[int, int], torch.Tensor]  # (start, end) -> stored rows [end - start, width] of the store's dtype
# (rows [n, width], grad: sparse COO float32 [n, dim], entries may repeat) -> None: updates in
# place the rows that have entries, weights and optimizer state
RowUpdate = Callable[[torch.Tensor, torch.Tensor], None]
NOT_HOT = -1  # the slot map's entry of a row in the slow tier


class BackingFile:
    """The open file a disk tier maps in place, whose size is checked before the tier is read or
    written: a file cut short under the map would end the process with SIGBUS ("Bus error") at
    the first access past its new end. A check is one ``fstat``; a cut that lands between a
    check and the access still ends in SIGBUS (docs/hotline.md).

    Args:
        fd: the file, open (this object closes it).
        path: its path, for messages.
        nbytes: the bytes the map covers.
    """

    def __init__(self, fd: int, path: Path, nbytes: int) -> None:
        self.fd, self.path, self.nbytes = fd, path, nbytes

    def check(self) -> None:
        """DistrecError naming the file when it is shorter than the map."""
        size = os.fstat(self.fd).st_size
        if size < self.nbytes:
            raise DistrecError(
                f"the slow tier's file {str(self.path)!r} was truncated to {size} bytes while in use (it had {self.nbytes}); "
                f"give it back its size (truncate -s {self.nbytes} FILE) and resume from the last checkpoint, which rewrites every row"
            )

    def close(self) -> None:
        os.close(self.fd)


def map_scratch_file(directory: Path, num_rows: int, width: int, dtype: np.dtype = np.dtype(np.float32)) -> np.ndarray:
    """A ``dtype`` [num_rows, width] memory map of a new, fully allocated, already unlinked file.

    The file is allocated up front (so writing pages later cannot fail for lack of disk
    space) and removed from the directory as soon as it is mapped: the mapping keeps its
    blocks alive, and nothing is left behind however the process ends. Rows are read at
    random, so the mapping is advised ``MADV_RANDOM``: a page fault reads its one page, not
    the kernel's readahead window around it (up to 32 pages), which under a small page
    cache mostly evicts rows still needed (benchmarks/results/2026-11-23-hotline-page-cache.md).
    """
    nbytes = num_rows * width * dtype.itemsize
    directory.mkdir(parents=True, exist_ok=True)

    def no_room(why: str) -> DistrecError:
        return DistrecError(
            f"cannot allocate the {nbytes / 2**30:.2f} GiB slow tier in {str(directory)!r} ({why}); free disk space or choose another directory for it"
        )

    free = shutil.disk_usage(directory).free
    if nbytes > free:
        raise no_room(f"{free / 2**30:.2f} GiB free")
    fd, name = tempfile.mkstemp(dir=directory, prefix=".distrec-slow-tier-", suffix=".f32")
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            raise no_room(e.strerror) from None
        return _map_rows(fd, num_rows, width, dtype)
    finally:
        os.close(fd)
        Path(name).unlink(missing_ok=True)


def map_table_file(path: str | Path, num_rows: int, width: int, dtype: np.dtype = np.dtype(np.float32)) -> tuple[np.ndarray, BackingFile]:
    """A ``dtype`` [num_rows, width] memory map of the existing file ``path``, read and written
    in place (shared: the file holds every write), advised ``MADV_RANDOM`` as a scratch file;
    and the file (open).

    The file holds exactly the rows, row-major ``dtype`` with no header (row ``i`` at byte
    ``i * width * dtype.itemsize``), e.g. written chunk by chunk with ``ndarray.tofile``.
    """
    nbytes = num_rows * width * dtype.itemsize
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        raise DistrecError(f"cannot open the slow tier's file {str(path)!r} ({e.strerror}); give an existing writable file of the stored rows") from None
    try:
        size = os.fstat(fd).st_size
        if size != nbytes:
            raise DistrecError(
                f"the slow tier's file {str(path)!r} has {size} bytes, not the {nbytes} of {num_rows} rows of {width} {dtype.name}; "
                "write it for these tables, this embedding optimizer and this table dtype"
            )
        return _map_rows(fd, num_rows, width, dtype), BackingFile(fd, Path(path), nbytes)
    except BaseException:
        os.close(fd)
        raise


def _map_rows(fd: int, num_rows: int, width: int, dtype: np.dtype) -> np.ndarray:
    """A shared ``dtype`` [num_rows, width] map of the open file ``fd``, advised MADV_RANDOM."""
    mapping = mmap.mmap(fd, num_rows * width * dtype.itemsize)
    mapping.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapping, dtype=dtype).reshape(num_rows, width)


class TwoTierStore:
    """All embedding rows (global ids), each in the fast tier or the slow tier.

    Args:
        num_rows: rows of all tables.
        width: elements per stored row (embedding weights plus optimizer state, ``RowLayout.width``).
        device: the model's device; the fast tier lives there.
        init: fills rows ``[start, end)``; called in chunks of about ``CHUNK_BYTES`` when the
            slow tier is first used, never when ``load`` comes first (a resumed run).
        slow: ``"disk"`` (memory-mapped scratch file), ``"host"`` (host memory, pinned for
            CUDA) or ``"auto"`` (host for an accelerator, disk for the host or with ``slow_file``).
        directory: where the disk tier's scratch file goes (default: the system temp dir).
        progress: show a progress bar while initialising.
        readahead: start the disk tier's reads of all the pages a gather touches together
            (``readahead.py``); False: each row's page is read when the gather faults on it,
            as with a plain memory-mapped table (no effect on a host tier).
        slow_file: an existing file of every row (``map_table_file``) used as the disk tier
            in place instead of a scratch file: its rows are the initial values (``init`` is
            not called), training writes into it, and it stays when the store is closed.
        dtype: the stored rows' elements (``RowLayout.unit``): float32, or int16 for half tables.

    Example:
        >>> store = TwoTierStore(1000, 4, torch.device("cpu"), init=lambda s, e: torch.zeros(e - s, 4))
        >>> store.set_hot(np.array([3, 7]))
        >>> store.gather(torch.tensor([7, 500])).shape
        torch.Size([2, 4])
        >>> store.close()
    """

    def __init__(
        self,
        num_rows: int,
        width: int,
        device: torch.device,
        init: RowInit,
        slow: str = "auto",
        directory: str | Path | None = None,
        progress: bool = False,
        readahead: bool = True,
        slow_file: str | Path | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        if slow not in SLOW_TIERS:
            raise DistrecError(f"slow tier {slow!r} is unknown; choose one of: {', '.join(SLOW_TIERS)}")
        self.device = torch.device(device)
        self.width = width
        self.num_rows = num_rows
        self.dtype = dtype
        self.numpy_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        if slow == "auto":
            slow = "disk" if self.device.type == "cpu" or slow_file is not None else "host"
        if slow_file is not None and slow != "disk":
            raise DistrecError(f"a slow tier file ({str(slow_file)!r}) needs the disk slow tier, not {slow!r}; set the slow tier to disk or drop the file")
        self.slow_kind = slow
        self.slow_directory = None if slow != "disk" else Path(slow_file).parent if slow_file is not None else Path(directory or tempfile.gettempdir())
        self.readahead: RowReadahead | None = None  # the disk tier's; None: gathers fault page by page
        self._file: BackingFile | None = None  # the file of every row given as the disk tier
        if slow_file is not None:
            rows, self._file = map_table_file(slow_file, num_rows, width, self.numpy_dtype)
            self._slow = torch.from_numpy(rows)
        elif self.slow_directory is not None:  # a scratch file, unlinked: no other program can cut it
            self._slow = torch.from_numpy(map_scratch_file(self.slow_directory, num_rows, width, self.numpy_dtype))
        else:
            self._slow = self._host_rows(num_rows, width)
        if self.slow_directory is not None and readahead:
            self.readahead = RowReadahead(self._slow)
        self.hot_ids = torch.empty(0, dtype=torch.int64, device=self.device)
        self.fast = torch.empty((0, width), dtype=dtype, device=self.device)
        self._slot_of = torch.full((num_rows,), NOT_HOT, dtype=torch.int32)
        self._base: FileIdentity | None = None  # the rows file this store last saved in full or loaded
        self._changed = torch.zeros(num_rows, dtype=torch.bool)  # slow-tier rows written since that file
        self._init = None if slow_file is not None else init  # until the slow tier is first used
        self._progress = progress
        self._init_lock = threading.Lock()  # the prefetch worker may be the first user
        # on CUDA, gathered cold rows travel to the device on their own stream, through one pinned buffer
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._staging = torch.empty(0, dtype=dtype, pin_memory=self._copy_stream is not None)
        self._staging_free: torch.cuda.Event | None = None  # recorded after the copy out of ``_staging``

    @property
    def slow(self) -> torch.Tensor:
        """The slow tier, [num_rows, width] of ``dtype`` (row i = global row i; hot rows' copies
        stale), initialised on first use; a disk tier's file is checked to be whole first
        (``BackingFile``: every gather, write-back, save and load goes through here)."""
        if self._file is not None:
            self._file.check()
        if self._init is not None:
            self.initialise()
        return self._slow

    def initialise(self) -> None:
        """Make the initial rows now (``init``) if nothing has yet: use, load or this."""
        with self._init_lock:
            if self._init is not None:
                for start, end in self._chunks(self.num_rows, "slow tier", self._progress):
                    self._slow[start:end] = self._init(start, end)
                self._init = None

    @property
    def fast_bytes(self) -> int:
        """Bytes of the fast tier: hot rows and their ids."""
        return self.fast.numel() * self.fast.element_size() + self.hot_ids.numel() * self.hot_ids.element_size()

    @property
    def slow_bytes(self) -> int:
        """Bytes of the slow tier: a slot for every row (hot rows' slots are stale)."""
        return self._slow.numel() * self._slow.element_size()

    def slots(self, ids: torch.Tensor) -> torch.Tensor:
        """Fast-tier slot of each of the global rows ``ids``, -1 for rows in the slow tier:
        int64 [n], on the device of ``ids``. Host ids read the slot map; device ids (a GPU's)
        are searched in the hot ids there, so that nothing waits for a copy to the host."""
        if ids.device.type == "cpu":
            return self._slot_of[ids].to(torch.int64)
        found, pos = find_sorted(self.hot_ids, ids)
        return torch.where(found, pos, -1)

    def gather(self, ids: torch.Tensor, width: int | None = None, slots: torch.Tensor | None = None) -> torch.Tensor:
        """The first ``width`` elements (default: all) of rows ``ids``, on the store's device,
        ready for the current stream (see ``gather_staged``)."""
        rows, ready = self.gather_staged(ids, width, slots)
        if ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(ready)
            rows.record_stream(stream)
        return rows

    def gather_staged(self, ids: torch.Tensor, width: int | None = None, slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The first ``width`` elements (default: all) of rows ``ids``, on the store's device,
        and on CUDA the event after which they are there (None elsewhere): the slow tier's
        rows are copied on the store's own stream, through a reused pinned buffer, so a
        stream that reads them waits for the event first (the host does not).

        Reads each row from the tier holding it (``slots``: ``self.slots(ids)``, if known).
        Safe to call from a worker thread while no update or tier move runs.
        """
        width = self.width if width is None else width
        ids = ids.to(self.device)
        slots = self.slots(ids) if slots is None else slots.to(self.device)
        hot = slots >= 0
        cold = ~hot
        if self._copy_stream is None:
            out = torch.empty((ids.numel(), width), dtype=self.dtype, device=self.device)
            out[hot] = self.fast[slots[hot], :width]
            out[cold] = self._read_slow(ids[cold], width)
            return out, None
        cold_ids = ids[cold]
        staged = self._read_slow(cold_ids, width, out=self._staging_rows(cold_ids.numel(), width))
        with torch.cuda.stream(self._copy_stream):
            out = torch.empty((ids.numel(), width), dtype=self.dtype, device=self.device)
            out[hot] = self.fast[slots[hot], :width]
            out[cold] = staged.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        self._staging_free = ready
        return out, ready

    def _staging_rows(self, num_rows: int, width: int) -> torch.Tensor:
        """Pinned [num_rows, width] of ``dtype`` for cold rows on their way to the device: one buffer,
        grown when needed, reused once the copy out of it is done (the worker thread waits)."""
        if self._staging_free is not None:
            self._staging_free.synchronize()
        if self._staging.numel() < num_rows * width:
            self._staging = torch.empty(max(num_rows * width, 2 * self._staging.numel()), dtype=self.dtype, pin_memory=True)
        return self._staging[: num_rows * width].view(num_rows, width)

    def update(self, slots: torch.Tensor, slot_grads: torch.Tensor, cold_ids: torch.Tensor, cold_grads: torch.Tensor, rule: RowUpdate) -> None:
        """Apply ``rule`` once to every row with gradient entries, in the tier holding it.

        Entries may repeat a row (the rule sums them): hot rows by fast-tier slot (``slots``
        int64 [n], ``slot_grads`` float32 [n, dim]), updated in place in the fast tier (``rule``
        gets the fast tier itself); cold rows by global id (``cold_ids`` int64 [m],
        ``cold_grads`` float32 [m, dim]), gathered from the slow tier on the host, updated, and
        written back.
        """
        dim = slot_grads.shape[1]
        if slots.numel():
            rule(self.fast, _row_gradient(slots.to(self.device), slot_grads, (self.fast.shape[0], dim)))
        if cold_ids.numel():
            ids, entry_row = torch.unique(cold_ids.cpu(), return_inverse=True)
            rows = self._read_slow(ids, self.width, ahead=False)  # gathered for the step's forward: in the page cache
            rule(rows, _row_gradient(entry_row, cold_grads.to(rows.device), (ids.numel(), dim)))
            self.slow[ids] = rows
            self._changed[ids] = True

    def set_hot(self, new_ids: np.ndarray) -> None:
        """Make the rows ``new_ids`` (ascending unique global ids) the fast tier.

        Rows leaving the fast tier are written back to the slow tier first; rows entering it
        are read from the slow tier; rows staying are copied within the fast tier.
        """
        new = torch.as_tensor(np.asarray(new_ids, dtype=np.int64))
        if new.numel() and bool(torch.any(new[1:] <= new[:-1]) | (new[0] < 0) | (new[-1] >= self.num_rows)):
            raise ValueError("hot ids must be ascending unique global row ids below num_rows")
        old = self.hot_ids.cpu()
        leaving = ~torch.isin(old, new)
        self.slow[old[leaving]] = self.fast[leaving.to(self.device)].cpu()
        self._changed[old[leaving]] = True
        old_slot = self._slot_of[new].long()
        was_hot = old_slot >= 0
        fast = empty_table(new.numel(), self.width, self.device, self.dtype)
        fast[was_hot.to(self.device)] = self.fast[old_slot[was_hot].to(self.device)]
        entering = ~was_hot
        fast[entering.to(self.device)] = self._read_slow(new[entering], self.width).to(self.device, non_blocking=True)
        self._slot_of[old[leaving]] = NOT_HOT
        self._slot_of[new] = torch.arange(new.numel(), dtype=torch.int32)
        self.fast, self.hot_ids = fast, new.to(self.device)

    def save(self, directory: str | Path, progress: bool = False) -> None:
        """Write every stored row, from the tier holding it, into the checkpoint directory
        ``directory`` (``row_files``' layout), chunk by chunk (memory stays bounded).

        When a checkpoint beside ``directory`` holds this store's base file and at most half
        the rows changed since it, the base is hard-linked and only the changed rows (and
        the fast tier's) are written; otherwise a full copy is written and becomes the base.
        """
        directory = Path(directory)
        base = find_base(directory, self._base) if self._base is not None else None
        if base is not None:
            changed = self._changed.clone()
            changed[self.hot_ids.cpu()] = True  # the fast tier's rows: their slow-tier copies are stale
            if 2 * int(changed.sum()) <= self.num_rows and link_base(base, directory):
                self._write_changed(directory, torch.nonzero(changed).flatten(), progress)
                return
        path = directory / BASE_FILE
        with atomic_path(path) as tmp:
            write_rows(tmp, (self.num_rows, self.width), self._current_rows(None, "saving rows", progress), self.numpy_dtype)
        self._base = FileIdentity.of(path)
        self._changed.zero_()

    def _write_changed(self, directory: Path, ids: torch.Tensor, progress: bool) -> None:
        """Write rows ``ids`` (int64 ascending) and their current values as the changed rows."""
        np.save(directory / CHANGED_IDS_FILE, ids.numpy())
        write_rows(directory / CHANGED_FILE, (ids.numel(), self.width), self._current_rows(ids, "saving changed rows", progress), self.numpy_dtype)

    def _current_rows(self, ids: torch.Tensor | None, desc: str, progress: bool) -> Iterator[np.ndarray]:
        """The current values of rows ``ids`` (int64 ascending; None: every row), chunk by
        chunk, each row from the tier holding it."""
        hot_ids, fast = self.hot_ids.cpu().numpy(), self.fast.cpu().numpy()
        for start, end in self._chunks(self.num_rows if ids is None else ids.numel(), desc, progress):
            if ids is None:
                rows, first, last = self.slow[start:end].numpy(), start, end
            else:
                chunk_ids = ids[start:end].numpy()
                rows, first, last = self.slow[ids[start:end]].numpy(), chunk_ids[0], chunk_ids[-1] + 1
            lo, hi = np.searchsorted(hot_ids, [first, last])
            if hi > lo:  # hot rows among them (every one of ``ids``): their slow-tier copies are stale
                hot = hot_ids[lo:hi]
                rows = rows.copy() if ids is None else rows  # not into the slow tier itself
                rows[hot - start if ids is None else np.searchsorted(chunk_ids, hot)] = fast[lo:hi]
            yield rows

    def load(self, directory: str | Path, progress: bool = False) -> None:
        """Replace every stored row by those a checkpoint directory holds (``save``; same
        shape and dtype); its base file becomes this store's base."""
        saved = SavedRows(directory, self.numpy_dtype)
        if saved.shape != (self.num_rows, self.width):
            raise DistrecError(
                f"embedding rows in {str(directory)!r} are {saved.shape}, expected {(self.num_rows, self.width)}; "
                "load them into a model with the same tables and optimizer"
            )
        self._init = None  # every row is replaced: no initial values to make
        for start, end in self._chunks(self.num_rows, "loading rows", progress):
            rows = saved.rows(start, end)
            if not np.isfinite(rows).all():
                bad = start + int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])
                raise DistrecError(
                    f"the embedding rows in {str(directory)!r} hold NaN or infinity (row {bad} first); resume from another checkpoint or retrain"
                )
            self.slow[start:end].numpy()[...] = rows
        self.fast = self._read_slow(self.hot_ids, self.width).to(self.device)
        self._base = FileIdentity.of(saved.base_path)
        self._changed.zero_()
        self._changed[torch.from_numpy(saved.changed_ids)] = True

    def _chunks(self, total: int, desc: str, progress: bool) -> Iterator[tuple[int, int]]:
        """Ranges of about CHUNK_BYTES of rows covering ``total`` rows, with a progress bar."""
        chunk = max(1, CHUNK_BYTES // (self.width * self.numpy_dtype.itemsize))
        with tqdm(total=total, unit="rows", unit_scale=True, desc=desc, disable=not progress) as bar:
            for start in range(0, total, chunk):
                end = min(start + chunk, total)
                yield start, end
                bar.update(end - start)

    def _read_slow(self, ids: torch.Tensor, width: int, ahead: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:
        """The first ``width`` elements of slow-tier rows ``ids``, in ``out`` (default: new
        ``_host_rows``; they may become the fast tier). With ``ahead``, the disk tier's reads
        of all the rows are started together first."""
        ids = ids if ids.device.type == "cpu" else ids.cpu()  # the slow tier is in host memory
        if ahead and self.readahead is not None:
            self.readahead(ids)
        return torch.index_select(self.slow[:, :width], 0, ids, out=self._host_rows(ids.numel(), width) if out is None else out)

    def _host_rows(self, num_rows: int, width: int) -> torch.Tensor:
        """Uninitialised [num_rows, width] of ``dtype`` in host memory: pinned when the fast tier
        is on CUDA (copies to it can run asynchronously), else on huge pages (``empty_table``)."""
        if self.device.type == "cuda":
            return torch.empty((num_rows, width), dtype=self.dtype, pin_memory=True)
        return empty_table(num_rows, width, dtype=self.dtype)

    def close(self) -> None:
        """Release both tiers (the disk tier's file is already unlinked; its blocks are freed)."""
        self.fast = self.fast.new_empty((0, self.width))
        self.hot_ids = self.hot_ids.new_empty(0)
        self._slow = torch.empty((0, self.width), dtype=self.dtype)
        self._init = None
        self._slot_of = torch.empty(0, dtype=torch.int32)
        self._changed = torch.empty(0, dtype=torch.bool)
        if self.readahead is not None:
            self.readahead.close()
            self.readahead = None
        if self._file is not None:
            self._file.close()  # the map keeps the file's blocks until it is released
            self._file = None

    def __enter__(self) -> TwoTierStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _row_gradient(rows: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A sparse COO row gradient of ``shape``: entry k adds ``values[k]`` to row ``rows[k]``."""
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape, check_invariants=False)
