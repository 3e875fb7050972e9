"""Checkpointer: saves a run's parts as one checkpoint and puts them back.

It is handed the parts (the parallel mode, which holds the model, optimizers and schedulers,
and the trainer's progress and random generators) and knows none of them: each part gives
its ``state_dict()``, which go side by side into every rank's state file; the mode adds the
layout to the metadata. The files and their atomic writing are ``distrec.components.checkpoint``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist

from distrec.components.checkpoint import CHECKPOINT_DIR, load_state, read_meta, save_checkpoint, save_checkpoint_collectively
from distrec.errors import DistrecError
from distrec.modes import format_tag
from distrec.parallel.mode import CheckpointFormat, ParallelMode
from distrec.train.rng import capture_rng, restore_rng


def _layout(world_size: int, embeddings: str, plan: dict[str, Any] | None) -> str:
    kinds = "+".join(sorted({t["sharding"] for t in plan["tables"]})) if plan else ""
    return f"{world_size} process{'es' if world_size > 1 else ''}, {embeddings} {kinds}".rstrip()


def _resharding(meta: dict[str, Any], mode: ParallelMode) -> str:
    """'' when the checkpoint's layout is this run's, else ', resharded from A to B'."""
    saved = _layout(int(meta.get("world_size", 1)), meta.get("embeddings", "single"), meta.get("plan"))
    now = _layout(mode.ctx.world_size, mode.embeddings, mode.plan.to_dict() if mode.plan is not None else None)
    return "" if saved == now else f", resharded from {saved} to {now}"


class Stateful(Protocol):
    """Anything whose state a checkpoint keeps (as torch's ``Stateful``)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RandomGenerators:
    """The Python, NumPy and torch generators of this process, as a checkpoint part."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng(state)


class Checkpointer:
    """Writes ``run_dir/checkpoint`` from ``mode`` and ``parts`` and restores them (collective
    when the run has several processes).

    Args:
        run_dir: the run directory.
        mode: the run's parallel mode (after ``parallelize``): its ranks and layout.
        checkpoint_format: the mode's checkpoint part (``Parallelized.checkpoint``).
        parts: name -> the trainer's parts; each name is a key of the state files.
        run_meta: the run's entries of the metadata (step, config, tables, ...).
    """

    def __init__(
        self, run_dir: Path, mode: ParallelMode, checkpoint_format: CheckpointFormat, parts: dict[str, Stateful], run_meta: Callable[[], dict[str, Any]]
    ) -> None:
        self.run_dir = Path(run_dir)
        self.mode = mode
        self.format = checkpoint_format
        self.parts = parts
        self.run_meta = run_meta

    def save(self, name: str = CHECKPOINT_DIR) -> None:
        """Write the checkpoint run_dir/``name`` (every rank writes its own state file)."""
        state = {**self.format.state_dict(), **{key: part.state_dict() for key, part in self.parts.items()}}
        index = [b["block"] for b in state.get("blocks", [])]
        meta = {**self.run_meta(), **self.format.meta(), "format": self.format.tag}
        ctx = self.mode.ctx
        if ctx.world_size == 1:
            meta["blocks"] = [{"rank": 0, "block": b} for b in index]
            save_checkpoint(self.run_dir, {0: state}, meta, write_files=self.format.write_files, name=name)
            return
        every: list[list[dict]] = [None] * ctx.world_size  # type: ignore[list-item]
        dist.all_gather_object(every, index)
        meta["blocks"] = [{"rank": r, "block": b} for r, blocks in enumerate(every) for b in blocks]
        save_checkpoint_collectively(self.run_dir, state, meta, name=name)

    def load(self, checkpoint: Path) -> None:
        """Continue from ``checkpoint``, saved with this world size and layout or any other the
        mode can reshard from (a part that an older checkpoint lacks keeps its state)."""
        own, meta = self._load_mode(checkpoint)
        for name, part in self.parts.items():
            if name in own:
                part.load_state_dict(own[name])
        if self.mode.ctx.rank == 0:
            print(f"distrec: resuming from step {meta['step']} of {checkpoint}{_resharding(meta, self.mode)}", file=sys.stderr)

    def restore_model(self, checkpoint: Path) -> None:
        """Put back the model and optimizers of ``checkpoint`` only (the other parts stay)."""
        self._load_mode(checkpoint)

    def _load_mode(self, checkpoint: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        ctx = self.mode.ctx
        meta = read_meta(checkpoint)
        saved_world = int(meta.get("world_size", 1))
        own = load_state(checkpoint, ctx.rank if ctx.rank < saved_world else 0, map_location=ctx.device)
        if format_tag(own, meta) != self.format.tag:
            raise DistrecError(
                f"checkpoint {str(checkpoint)!r} was saved by another kind of run than this one ({self.mode.name}); "
                "resume it with the config and process count it was saved with"
            )
        self.format.load_state_dict(own, checkpoint, meta)
        return own, meta
