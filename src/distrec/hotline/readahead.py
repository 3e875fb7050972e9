"""Reading the pages of many random rows of a memory-mapped table ahead, all at once.

Gathering rows from a memory map whose pages are on disk faults on one page at a time, and
each fault waits for its read before the next one starts: the disk sees one request at a
time. Advising the kernel first that every page the rows touch will be needed
(``MADV_WILLNEED``, which starts the reads without waiting for them) puts all the requests
in flight together; the gather then waits only for reads already under way
(``python benchmarks/cold_gather.py``; benchmarks/results/2026-11-23-hotline-page-cache.md).
When every page is already cached the advice is wasted work, a cost worth paying only where
gathers miss the page cache, as a disk tier's do.

The advice is one ``process_madvise`` system call per 1024 rows (Linux >= 5.10); where that
call is missing or not permitted for the process itself (older kernels without
``CAP_SYS_NICE``), one ``madvise`` per row's pages instead. Advice is only a hint: a failure
leaves the gather correct, just slower.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

import numpy as np
import torch

PAGE = mmap.PAGESIZE
MADV_WILLNEED = 3  # <sys/mman.h>
IOV_MAX = 1024  # iovecs per process_madvise call
SYS_PIDFD_OPEN = 434  # the same number on every Linux architecture (syscalls added after 4.20)
SYS_PROCESS_MADVISE = 440


class RowReadahead:
    """Starts the disk reads of rows of a memory-mapped 2-d tensor (row ``i`` at byte
    ``i * row_bytes`` from the mapping's start), without waiting for them."""

    def __init__(self, table: torch.Tensor) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.base = table.data_ptr()
        self.row_bytes = table.stride(0) * table.element_size()
        self._pidfd = int(self._libc.syscall(ctypes.c_long(SYS_PIDFD_OPEN), os.getpid(), 0))

    def __call__(self, ids: torch.Tensor) -> None:
        """Advise that the pages of rows ``ids`` (int64, repeats allowed) will be read soon."""
        if not ids.numel():
            return
        start = self.base + ids.cpu().numpy().astype(np.int64) * self.row_bytes
        pages = np.union1d(start - start % PAGE, (start + self.row_bytes - 1) // PAGE * PAGE)  # a row may straddle two pages
        if self._pidfd >= 0 and self._advise_in_batches(pages):
            return
        for page in pages.tolist():
            self._libc.madvise(page, PAGE, MADV_WILLNEED)

    def _advise_in_batches(self, pages: np.ndarray) -> bool:
        """``process_madvise`` on ``pages`` (addresses), ``IOV_MAX`` at a time; False, and
        never tried again, when the call is unavailable."""
        iovecs = np.empty((pages.size, 2), dtype=np.uint64)
        iovecs[:, 0] = pages
        iovecs[:, 1] = PAGE
        for chunk in range(0, pages.size, IOV_MAX):
            if not self._process_madvise(np.ascontiguousarray(iovecs[chunk : chunk + IOV_MAX])):
                self.close()
                return False
        return True

    def _process_madvise(self, iovecs: np.ndarray) -> bool:
        """One process_madvise call on this process; False when the call is unavailable."""
        args = (ctypes.c_long(SYS_PROCESS_MADVISE), self._pidfd, ctypes.c_void_p(iovecs.ctypes.data), ctypes.c_size_t(len(iovecs)), MADV_WILLNEED, 0)
        if self._libc.syscall(*args) >= 0:
            return True
        return ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM, errno.EINVAL)

    def close(self) -> None:
        """Release the process file descriptor."""
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
