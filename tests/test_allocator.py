"""keep_freed_memory: large freed blocks are reused instead of being mapped afresh; empty_table: tables asked onto huge pages."""

import json
import os
import subprocess
import sys

import pytest
import torch

from distrec.allocator import HUGE_PAGE_BYTES, OPT_OUT_VARIABLE, empty_table
from memory_maps import middle, vm_flags

# Allocates and fills a 64 MiB tensor 8 times after a warm-up, reporting minor page faults.
# During the warm-up glibc's heap grows (a freed block is just too small for the next aligned
# one until several have coalesced); after it the same pages are reused.
_PROGRAM = """
import json, resource, torch
from distrec.allocator import keep_freed_memory
kept = keep_freed_memory()
for _ in range(16):
    torch.empty(16 << 20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    torch.empty(16 << 20).fill_(1.0)
print(json.dumps({"kept": kept, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _run(setting: str) -> dict:
    env = {**os.environ, OPT_OUT_VARIABLE: setting}
    out = subprocess.run([sys.executable, "-c", _PROGRAM], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_freed_blocks_are_reused_unless_opted_out():
    kept, default = _run("1"), _run("0")
    assert kept["kept"] and not default["kept"]
    pages = 8 * (64 << 20) // os.sysconf("SC_PAGE_SIZE")  # a fresh mapping faults every page
    assert default["faults"] > pages / 2
    assert kept["faults"] < pages / 20


def test_a_table_is_advised_onto_huge_pages():
    table = empty_table(HUGE_PAGE_BYTES // 16, 16)  # 4 huge pages of float32
    assert table.shape == (HUGE_PAGE_BYTES // 16, 16) and table.dtype == torch.float32
    assert "hg" in vm_flags(middle(table))
