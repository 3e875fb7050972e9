"""How the process takes memory from the OS: freed heap kept for reuse (glibc only), and
embedding tables backed by huge pages (Linux).

*Huge pages for tables.* A lookup or a row update touches rows spread over a table of
hundreds of MB, each row on its own 4 KiB page, so nearly every row costs a TLB miss and a
page-table walk besides its cache miss. ``empty_table`` asks the kernel for 2 MiB pages
(``madvise(MADV_HUGEPAGE)``, honoured when transparent huge pages are in ``madvise`` or
``always`` mode) before the memory is first touched, so the pooling and the row-wise Adagrad
update pay fewer page walks (benchmarks/results/2026-11-27-cpu-kernels.md). Where the kernel has no huge pages
to give, the table keeps 4 KiB pages and nothing else changes.

*Freed heap kept.*

The planner's micro-benchmarks time embedding steps built from stock PyTorch parts
(``distrec.planner.workload``): ``F.embedding_bag`` with sparse gradients and
``torch.optim.SGD``, which allocate the same large temporaries every step (a table's
sparse gradient, indices x dim floats, tens of MB for 4096 bags; its coalesced copy). glibc
serves a block above its mmap threshold (128 KiB to 32 MiB, adapting) with a fresh ``mmap``
and returns it with ``munmap`` on free, so every step pays the kernel to map and zero the
same pages again, and how often depends on the allocator's history: the same step's time
varies with it, and a cost model trained on such times learns the allocator's moods
(``benchmarks/allocator.py``; benchmarks/results/2026-11-24-neuroshard-planner.md). ``mallopt`` raises the mmap and trim thresholds so that blocks come from the heap
and freed ones stay there, as LD_PRELOADing jemalloc or tcmalloc would, without another
library. The planner's measuring processes call it, and so does every training step on a
CPU model (``distrec.components.step.TrainStep``), whose activations, gradients and optimizer
scratch are temporaries of the same kind.

The price is resident memory: freed heap (up to ``RETAINED_BYTES``) is kept rather than
returned, and during the first steps the heap grows past the working set, since a freed
block is a little too small for the next aligned one of its size until several have
coalesced (eight 64 MiB blocks before a ninth is served from freed memory). Set
``DISTREC_KEEP_FREED_MEMORY=0`` to leave the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

import torch

RETAINED_BYTES = 1 << 30
"""Blocks up to this size (bytes) come from the heap, and this much freed heap may be kept."""
FALLBACK_MMAP_THRESHOLD = 32 << 20
"""glibc builds that cap the mmap threshold at half their heap size accept this (bytes)."""
_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
OPT_OUT_VARIABLE = "DISTREC_KEEP_FREED_MEMORY"
HUGE_PAGE_BYTES = 2 << 20
"""Tables smaller than a huge page are left on 4 KiB pages."""
_MADV_HUGEPAGE = 14  # from Linux's mman-common.h
_PAGE_BYTES = 4096


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, or None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def empty_table(num_rows: int, dim: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised [num_rows, dim] table of ``dtype``; on a Linux CPU, backed by huge pages
    where the kernel has them (see the module doc). Fill it before reading it."""
    table = torch.empty(num_rows, dim, device=device, dtype=dtype)
    size = table.numel() * table.element_size()
    libc = _libc() if table.device.type == "cpu" and sys.platform.startswith("linux") and size >= HUGE_PAGE_BYTES else None
    if libc is not None:
        start = table.data_ptr() // _PAGE_BYTES * _PAGE_BYTES
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(table.data_ptr() + size - start), _MADV_HUGEPAGE)  # advice: failure is harmless
    return table


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds in this process (see the module doc).

    Returns:
        True if the thresholds were set; False on a non-glibc platform or when the user
        opted out with ``DISTREC_KEEP_FREED_MEMORY=0``. Idempotent.
    """
    if os.environ.get(OPT_OUT_VARIABLE, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # no C library, or one without mallopt (musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not mallopt(_M_MMAP_THRESHOLD, RETAINED_BYTES) and not mallopt(_M_MMAP_THRESHOLD, FALLBACK_MMAP_THRESHOLD):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, RETAINED_BYTES))
