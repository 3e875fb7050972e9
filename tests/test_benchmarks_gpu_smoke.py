"""benchmarks/gpu_smoke.py on a machine without a GPU: one line saying so, before any work."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_smoke.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the smoke test would run")
def test_without_a_gpu_the_smoke_test_says_so_in_one_line():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["gpu_smoke: no CUDA device here; run it on a GPU machine with the CUDA build of torch (docs/gpu.md)"]
