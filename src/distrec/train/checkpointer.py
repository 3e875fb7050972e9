"""Checkpointer: saves a run's parts as one checkpoint and puts them back.

It is handed the parts (the parallel mode, which holds the model, optimizers and schedulers,
and the trainer's progress and random generators) and knows none of them: each part gives
its ``state_dict()``, which go side by side into every rank's state file; the mode adds the
layout to the metadata. The files and their atomic writing are ``distrec.components.checkpoint``'s.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist

from distrec import config as config_mod
from distrec.components.checkpoint import CHECKPOINT_DIR, META_FILE, RESTART_FIX, load_state, read_meta, save_checkpoint, save_checkpoint_collectively
from distrec.errors import DistrecError
from distrec.modes import format_tag
from distrec.parallel.mode import CheckpointFormat, ParallelMode
from distrec.tables import TableConfig
from distrec.train.rng import capture_rng, restore_rng

BLOCK_KEYS = ("table", "row_start", "row_end", "col_start", "col_end")
"""The keys of a ``blocks`` entry's block: rows [row_start, row_end) x columns [col_start, col_end) of a table."""


def _layout(world_size: int, embeddings: str, plan: dict[str, Any] | None) -> str:
    kinds = "+".join(sorted({t["sharding"] for t in plan["tables"]})) if plan else ""
    return f"{world_size} process{'es' if world_size > 1 else ''}, {embeddings} {kinds}".rstrip()


def _resharding(meta: dict[str, Any], mode: ParallelMode) -> str:
    """'' when the checkpoint's layout is this run's, else ', resharded from A to B'."""
    saved = _layout(int(meta.get("world_size", 1)), meta.get("embeddings", "single"), meta.get("plan"))
    now = _layout(mode.ctx.world_size, mode.embeddings, mode.plan.to_dict() if mode.plan is not None else None)
    return "" if saved == now else f", resharded from {saved} to {now}"


def read_run_meta(checkpoint: Path) -> dict[str, Any]:
    """``read_meta`` of a run's checkpoint, after checking the run's entries (``Checkpointer.save``):
    a DistrecError naming meta.json and the first missing or malformed entry, never a KeyError
    or a model built from nonsense."""
    meta = read_meta(checkpoint)
    problem = _run_meta_problem(meta)
    if problem:
        raise DistrecError(f"checkpoint metadata {str(Path(checkpoint) / META_FILE)!r} {problem}; {RESTART_FIX}")
    return meta


def _is_count(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _run_meta_problem(meta: dict[str, Any]) -> str:
    """What is wrong with the run's entries of ``meta`` ('' when nothing is)."""
    for key, minimum in (("step", 0), ("num_dense", 0), ("world_size", 1)):
        if key not in meta and key != "world_size":  # world_size: absent in one-process checkpoints of old
            return f"holds no {key}"
        if not _is_count(meta.get(key, 1), minimum):
            return f"has {key} {meta[key]!r}, not a count of at least {minimum}"
    if not isinstance(meta.get("config"), dict):
        return "holds no config (a mapping of the run's settings)"
    try:
        config_mod.from_dict(meta["config"])
    except DistrecError as e:
        return f"holds an invalid config ({e})"
    tables = meta.get("tables")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        return "holds no tables (a list of the run's tables)"
    shapes = {}
    for entry in tables:
        try:
            table = TableConfig.from_dict(entry)
        except (DistrecError, TypeError):
            return f"has a malformed tables entry {json.dumps(entry)[:200]}"
        shapes[table.name] = (table.num_rows, table.dim)
    if len(shapes) != len(tables):
        return "lists a table twice"
    for entry in meta.get("blocks", []):
        if not _is_block_entry(entry, shapes, int(meta.get("world_size", 1))):
            return f"has a malformed blocks entry {json.dumps(entry)[:200]}"
    return ""


def _is_block_entry(entry: Any, shapes: dict[str, tuple[int, int]], world_size: int) -> bool:
    """Whether ``entry`` is {"rank": a rank below ``world_size``, "block": a rectangle inside a table of ``shapes``}."""
    if not isinstance(entry, dict) or set(entry) != {"rank", "block"} or not _is_count(entry["rank"]) or entry["rank"] >= world_size:
        return False
    block = entry["block"]
    if not isinstance(block, dict) or set(block) != set(BLOCK_KEYS) or block["table"] not in shapes:
        return False
    if not all(_is_count(block[key]) for key in BLOCK_KEYS[1:]):
        return False
    rows, dim = shapes[block["table"]]
    return block["row_start"] <= block["row_end"] <= rows and block["col_start"] <= block["col_end"] <= dim


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
            save_checkpoint(self.run_dir, {0: state}, meta, write_files=self.format.write_files, name=name, files_bytes=self.format.files_bytes())
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
        meta = read_run_meta(checkpoint)
        saved_world = int(meta.get("world_size", 1))
        own = load_state(checkpoint, ctx.rank if ctx.rank < saved_world else 0, map_location=ctx.device)
        if format_tag(own, meta) != self.format.tag:
            raise DistrecError(
                f"checkpoint {str(checkpoint)!r} was saved by another kind of run than this one ({self.mode.name}); "
                "resume it with the config and process count it was saved with"
            )
        self.format.load_state_dict(own, checkpoint, meta)
        return own, meta
