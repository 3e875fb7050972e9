"""Tower modules in checkpoints: one entry per tower, whichever process held it.

A single process holds every tower; in a distributed run each host holds its own (every
rank of the host has the same copy, so its local rank 0 saves it). An entry keeps the
module's weights and, per parameter name, the tower optimizer's state (Adam's moments and
step), so a run resumes exactly and a gathered model (``distrec evaluate``) gets every
tower, whatever the saving run's topology was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from distrec.components.checkpoint import load_state
from distrec.errors import DistrecError


def _copy(value: Any) -> Any:
    return value.detach().clone() if torch.is_tensor(value) else value


def export_towers(embeddings: nn.Module, optimizer: Optimizer | None) -> list[dict[str, Any]]:
    """The tower modules ``embeddings.tower_modules()`` holds: ``tower`` (index), ``module``
    (state dict) and ``state`` (parameter name -> the optimizer's state of that parameter)."""
    out = []
    for tower, module in embeddings.tower_modules().items():
        state = {}
        if optimizer is not None:
            state = {name: {k: _copy(v) for k, v in optimizer.state[p].items()} for name, p in module.named_parameters() if p in optimizer.state}
        out.append({"tower": tower, "module": {k: _copy(v) for k, v in module.state_dict().items()}, "state": state})
    return out


@torch.no_grad()
def import_towers(embeddings: nn.Module, optimizer: Optimizer | None, saved: list[dict[str, Any]]) -> None:
    """Load every tower module ``embeddings`` holds (and its optimizer state) from ``saved`` entries."""
    by_tower = {entry["tower"]: entry for entry in saved}
    for tower, module in embeddings.tower_modules().items():
        entry = by_tower[tower]
        module.load_state_dict(entry["module"])
        if optimizer is None:
            continue
        for name, p in module.named_parameters():
            if name in entry["state"]:
                optimizer.state[p] = {k: v.to(p.device) if torch.is_tensor(v) else v for k, v in entry["state"][name].items()}


def restore_towers(checkpoint: Path, meta: dict[str, Any], embeddings: torch.nn.Module, optimizer: Any) -> None:
    """Load the tower modules ``embeddings`` holds (and ``optimizer``'s state of them) from a checkpoint.

    Only the rank files holding those towers are read; nothing happens without towers.
    """
    saved_towers = meta.get("towers")
    if saved_towers is None:
        return
    held = embeddings.tower_modules()
    if len(saved_towers["rank"]) != len(saved_towers["features"]) or any(t >= len(saved_towers["rank"]) for t in held):
        raise DistrecError(
            f"checkpoint {str(checkpoint)!r} has {len(saved_towers['rank'])} towers but this run has more; "
            "resume it with the towers (and --hosts) it was trained with"
        )
    sources = sorted({saved_towers["rank"][t] for t in held})
    import_towers(embeddings, optimizer, [entry for r in sources for entry in load_state(checkpoint, r)["towers"]])
