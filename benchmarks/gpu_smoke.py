"""The first command on a GPU machine: the GPU tests, then distrec against TorchRec on GPUs.

1. ``pytest -m gpu``: one GPU trains what the CPU trains (ordinary and Hotline), and two ranks
   over NCCL train what one CPU process trains (``tests/test_gpu.py``);
2. ``benchmarks/vs_torchrec.py --device cuda``: the same DLRM (26 tables x 100,000 rows x dim
   64) trained by ``distrec train`` and by TorchRec's DistributedModelParallel with FBGEMM's
   GPU kernels, one GPU per process, interleaved rounds.

Needs CUDA and, for step 2, an environment with TorchRec and the CUDA build of fbgemm-gpu
(``--torchrec-python``; without it the comparison is skipped and says so). Nothing here has
run on a GPU yet: docs/gpu.md says what was checked on the CPU. The last line printed is the
harness's result record: the tests' outcome, and both sides' samples/s per round.

Usage:
    python benchmarks/gpu_smoke.py --torchrec-python ../venv-torchrec-cuda/bin/python
    python benchmarks/gpu_smoke.py --procs 1 --rounds 2          # one GPU, quick
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import torch

import harness

ROOT = Path(__file__).resolve().parents[1]


def gpu_tests() -> dict[str, int]:
    """Run the ``gpu`` tests; their counts (passed, failed, skipped) and pytest's exit code."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")], capture_output=True, text=True, cwd=ROOT
    )
    print(done.stdout[-3000:], file=sys.stderr)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", done.stdout)}
    return {
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0),
        "skipped": counts.get("skipped", 0),
        "exit_code": done.returncode,
    }


def comparison(args: argparse.Namespace) -> dict | None:
    """``vs_torchrec.py --device cuda``'s result record, or None when TorchRec is not importable there."""
    command = [sys.executable, str(ROOT / "benchmarks" / "vs_torchrec.py"), "--device", "cuda", "--torchrec-python", args.torchrec_python]
    command += ["--procs", *map(str, args.procs), "--pooling-factor", *map(str, args.pooling_factor), "--rounds", str(args.rounds)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode == 2 and "not importable" in done.stderr:
        print(done.stderr.strip(), file=sys.stderr)
        return None
    if done.returncode != 0:
        raise SystemExit(f"vs_torchrec.py --device cuda failed:\n{done.stderr[-3000:]}")
    return harness.last_json_line(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torchrec-python", default=sys.executable, help="python of an environment with TorchRec and CUDA fbgemm-gpu (default: this one)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="processes, one GPU each (default 1 2)")
    parser.add_argument("--pooling-factor", type=int, nargs="+", default=[1, 20], help="indices per bag (default 1 20)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--out", type=Path, help="where to write the result JSON (default: not written)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_smoke: no CUDA device here; run it on a GPU machine with the CUDA build of torch (docs/gpu.md)")
    if max(args.procs) > torch.cuda.device_count():
        raise SystemExit(f"gpu_smoke: --procs {max(args.procs)} needs as many GPUs, this machine has {torch.cuda.device_count()}")
    tests = gpu_tests()
    compared = comparison(args)
    systems = [] if compared is None else [harness.SystemResult(s["system"], s["metric"], s["unit"], harness.Samples(s["rounds"])) for s in compared["systems"]]
    extra = {"gpus": torch.cuda.device_count(), "gpu": torch.cuda.get_device_name(0), "tests": tests}
    extra["results"] = compared["results"] if compared is not None else "skipped: TorchRec with CUDA fbgemm-gpu not importable by --torchrec-python"
    harness.finish(harness.ResultRecord("gpu_smoke", systems, None if compared is None else compared["ratio"], extra), args.out)
    if tests["exit_code"] != 0:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
