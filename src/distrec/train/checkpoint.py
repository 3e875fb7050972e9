"""Checkpoints: a directory written under a temporary name and renamed when complete.

A run killed while saving leaves the previous checkpoint usable: the new one only replaces
it by a rename once every file is written (see ``distrec.io.atomic_directory``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distrec.errors import DistrecError
from distrec.io import atomic_directory, publish_directory
from distrec.parallel.reshard import Block, held_blocks, import_blocks

CHECKPOINT_DIR = "checkpoint"
META_FILE = "meta.json"
FORMAT_VERSION = 2


def state_file(rank: int = 0) -> str:
    """File name of one rank's tensors inside a checkpoint directory."""
    return f"state-rank{rank}.pt"


def save_checkpoint(
    run_dir: Path, states: dict[int, dict[str, Any]], meta: dict[str, Any], write_files: Callable[[Path], None] | None = None
) -> Path:
    """Write ``states`` (rank -> state dict of tensors) and ``meta`` (JSON) as run_dir/checkpoint.

    ``write_files(directory)``, when given, adds files too large for a state dict (Hotline's
    tables) to the checkpoint directory while it is being built.
    """
    target = Path(run_dir) / CHECKPOINT_DIR
    with atomic_directory(target) as tmp:
        for rank, state in states.items():
            torch.save(state, tmp / state_file(rank))
        if write_files is not None:
            write_files(tmp)
        (tmp / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2))
    return target


def save_checkpoint_collectively(run_dir: Path, state: dict[str, Any], meta: dict[str, Any], group: dist.ProcessGroup | None = None) -> Path:
    """Every rank of ``group`` writes its ``state`` into run_dir/checkpoint; rank 0 adds ``meta``.

    A collective call. The files go into a staging directory that rank 0 renames into place
    only after every rank has written, so a run killed during the save (any rank) leaves the
    previous checkpoint complete; a staging directory left behind is cleared at the next save.
    """
    rank = dist.get_rank(group)
    target = Path(run_dir) / CHECKPOINT_DIR
    staging = target.with_name(f".{CHECKPOINT_DIR}.writing")
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    dist.barrier(group)
    torch.save(state, staging / state_file(rank))
    dist.barrier(group)
    if rank == 0:
        (staging / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2))
        publish_directory(staging, target)
    dist.barrier(group)
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
    """One rank's state dict from a checkpoint directory (tensors memory-mapped, read on use)."""
    f = Path(checkpoint) / state_file(rank)
    if not f.is_file():
        raise DistrecError(f"checkpoint {str(checkpoint)!r} has no state for rank {rank}; it is incomplete, resume from an earlier run directory")
    return torch.load(f, map_location=map_location, weights_only=False, mmap=True)


def restore_embeddings(checkpoint: Path, meta: dict[str, Any], embeddings: torch.nn.Module, optimizer: Any, rank: int) -> None:
    """Fill the blocks ``embeddings`` holds on ``rank`` (and ``optimizer``'s row state) from a checkpoint.

    Only the rank files holding overlapping blocks are read (memory-mapped). A checkpoint of
    local embeddings gives rank r the tables of saved rank r mod (saved world size).
    """
    index = meta["blocks"]
    if meta.get("embeddings") == "local":
        sources = {rank % int(meta["world_size"])}
    else:
        wanted = [h.block for h in held_blocks(embeddings)]
        sources = {
            entry["rank"]
            for entry in index
            if any(w.overlap(Block(**entry["block"])) for w in wanted)
        }
    saved = [b for r in sorted(sources) for b in load_state(checkpoint, r)["blocks"]]
    import_blocks(embeddings, optimizer, saved)
