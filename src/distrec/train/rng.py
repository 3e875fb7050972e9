"""The random number generators' states (Python, NumPy, torch) as plain checkpoint values."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """Every generator's state, as tensors, ints and lists (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Set every generator to ``capture_rng()``'s state (also the tuples older checkpoints hold)."""
    torch.set_rng_state(state["torch"])
    numpy, python = state["numpy"], state["python"]
    if isinstance(numpy, dict):
        numpy = (numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"], numpy["gauss"])
    np.random.set_state(numpy)
    if isinstance(python, dict):
        python = (python["version"], tuple(python["internal"]), python["gauss_next"])
    random.setstate(python)
