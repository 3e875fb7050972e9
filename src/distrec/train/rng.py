"""The random number generators' states (torch, NumPy, Python) as plain checkpoint data.

``capture_rng()`` holds only tensors, ints, floats, strings and lists, so a checkpoint
holding it loads with ``torch.load(weights_only=True)``: nothing in it is unpickled as code.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """The states of torch's CPU generator (uint8 tensor), NumPy's global MT19937 generator
    (its 624 key words as an int64 tensor plus position and Gaussian cache) and Python's
    ``random`` (its 625 state words as an int64 tensor plus the Gaussian cache)."""
    kind, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, words, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": {"version": int(version), "words": torch.tensor(words, dtype=torch.int64), "gauss_next": gauss_next},
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Set the three generators to a state from ``capture_rng()``."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(w) for w in p["words"].tolist()), p["gauss_next"]))
