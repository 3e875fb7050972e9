"""Checkpoints: a directory written under a temporary name and renamed when complete.

A run killed while saving leaves the previous checkpoint usable: the new one only replaces
it by a rename once every file is written (see ``distrec.io.atomic_directory``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from distrec.errors import DistrecError
from distrec.io import atomic_directory

CHECKPOINT_DIR = "checkpoint"
META_FILE = "meta.json"
FORMAT_VERSION = 1


def state_file(rank: int = 0) -> str:
    """File name of one rank's tensors inside a checkpoint directory."""
    return f"state-rank{rank}.pt"


def save_checkpoint(run_dir: Path, states: dict[int, dict[str, Any]], meta: dict[str, Any]) -> Path:
    """Write ``states`` (rank -> state dict of tensors) and ``meta`` (JSON) as run_dir/checkpoint."""
    target = Path(run_dir) / CHECKPOINT_DIR
    with atomic_directory(target) as tmp:
        for rank, state in states.items():
            torch.save(state, tmp / state_file(rank))
        (tmp / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2))
    return target


def find_checkpoint(path: Path) -> Path:
    """The checkpoint directory for ``path``: a run directory or the checkpoint folder itself.

    Falls back to the previous checkpoint when a save was interrupted between its two renames.
    """
    path = Path(path)
    for candidate in (path, path / CHECKPOINT_DIR, path / f".{CHECKPOINT_DIR}.old", path.parent / f".{path.name}.old"):
        if (candidate / META_FILE).is_file():
            return candidate
    if not path.exists():
        raise DistrecError(f"checkpoint {str(path)!r} not found; pass a run directory written by 'distrec train --out'")
    raise DistrecError(f"{str(path)!r} holds no checkpoint ({CHECKPOINT_DIR}/{META_FILE} missing); train with --out first")


def has_checkpoint(path: Path) -> bool:
    """Whether ``path`` (a run directory or checkpoint folder) holds a readable checkpoint."""
    try:
        find_checkpoint(path)
    except DistrecError:
        return False
    return True


def read_meta(checkpoint: Path) -> dict[str, Any]:
    """The JSON metadata of a checkpoint directory."""
    meta = json.loads((Path(checkpoint) / META_FILE).read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise DistrecError(f"checkpoint {str(checkpoint)!r} has format {meta.get('format_version')}, this distrec reads {FORMAT_VERSION}; use the matching distrec version")
    return meta


def load_state(checkpoint: Path, rank: int = 0, map_location: Any = None) -> dict[str, Any]:
    """One rank's state dict from a checkpoint directory."""
    f = Path(checkpoint) / state_file(rank)
    if not f.is_file():
        raise DistrecError(f"checkpoint {str(checkpoint)!r} has no state for rank {rank}; resume with the world size it was saved with")
    return torch.load(f, map_location=map_location, weights_only=False)
