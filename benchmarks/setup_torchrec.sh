#!/usr/bin/env bash
# Create a virtual environment with TorchRec beside torch 2.13.0 (CPU), for the side-by-side
# measurements of benchmarks/sharding.py and the TorchRec interop tests, then check the import.
#
# Usage: benchmarks/setup_torchrec.sh [VENV_PATH]     (default: venv-torchrec in the repo root)
#
# The pair is pinned: the newest fbgemm-gpu-cpu (1.9.x) fails to load with torch 2.13
# (undefined symbol at import); fbgemm-gpu-cpu 1.8.0 with torchrec 1.8.0 loads. torchrec is
# installed with --no-deps because its metadata asks for the CUDA fbgemm-gpu. distrec's own
# pure-Python dependencies are added so `PYTHONPATH=src VENV/bin/python -m pytest` runs there.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo/venv-torchrec}"
python="${PYTHON:-python3}"

"$python" -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install torch==2.13.0 fbgemm-gpu-cpu==1.8.0
"$pip" install --no-deps torchrec==1.8.0
"$pip" install torch==2.13.0 tensordict==0.15.3 torchmetrics==1.0.3 tqdm pyre-extensions==0.0.32
"$pip" install torch==2.13.0 numpy pyarrow PyYAML scikit-learn matplotlib k-means-constrained numba pytest pytest-timeout
"$venv/bin/python" -c "import torchrec, fbgemm_gpu; import torchrec.distributed.planner; print('torchrec', torchrec.__version__, 'imports')"
echo "ready: PYTHONPATH=$repo/src $venv/bin/python benchmarks/sharding.py --quick"
