import ctypes
import mmap
import time

import numpy as np
import pytest
import torch

from distrec.hotline import readahead
from distrec.hotline.readahead import RowReadahead
from distrec.hotline.tiers import map_scratch_file

ROWS, WIDTH = 20_000, 64  # 256-byte rows, 16 per page


def resident_pages(table: torch.Tensor) -> set[int]:
    """Pages of ``table`` in the page cache (``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = -(-table.numel() * 4 // mmap.PAGESIZE)
    vec = np.zeros(pages, np.uint8)
    assert libc.mincore(table.data_ptr(), pages * mmap.PAGESIZE, vec.ctypes.data) == 0
    return set(np.flatnonzero(vec & 1).tolist())


def pages_after_readahead(table: torch.Tensor, ids: list[int], want: set[int]) -> set[int]:
    """Advise rows ``ids``, then wait (the reads are asynchronous) until ``want`` is resident
    or a generous 10 s pass; the resident pages."""
    advise = RowReadahead(table)
    advise(torch.tensor(ids))
    advise.close()
    deadline = time.monotonic() + 10
    while not want <= (resident := resident_pages(table)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return resident


@pytest.mark.parametrize("fallback", [False, True])
def test_readahead_brings_exactly_the_rows_pages_in(tmp_path, monkeypatch, fallback):
    if fallback:  # no process_madvise on this "kernel": one madvise per page instead
        monkeypatch.setattr(readahead, "SYS_PROCESS_MADVISE", 100_000)
    table = torch.from_numpy(map_scratch_file(tmp_path, ROWS, WIDTH))  # allocated, never touched
    assert resident_pages(table) == set()
    rows_per_page = mmap.PAGESIZE // (WIDTH * 4)
    ids = [3, 3, 17 * rows_per_page + 5, ROWS - 1] + list(range(100 * rows_per_page, 1200 * rows_per_page, rows_per_page))
    want = {i // rows_per_page for i in ids}
    assert len(want) > readahead.IOV_MAX  # more than one process_madvise call
    assert pages_after_readahead(table, ids, want) == want


def test_a_row_straddling_two_pages_brings_both_in(tmp_path):
    table = torch.from_numpy(map_scratch_file(tmp_path, 1000, 1000))  # 4000-byte rows
    assert pages_after_readahead(table, [1], {0, 1}) == {0, 1}  # bytes 4000-7999
    assert torch.index_select(table, 0, torch.tensor([1])).shape == (1, 1000)
