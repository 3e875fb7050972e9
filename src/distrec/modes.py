"""The composition root of the parallel axes: which component applies each axis value, in
which order, and which format reads a checkpoint.

A run's :class:`~distrec.parallel.spec.ParallelSpec` holds one value per axis. The placement
axis picks one mode (``PLACEMENTS``: a mapping, so no order matters); every other axis is a
component made by one entry of ``AXES``, applied in that fixed order (each gets the ranks
the previous left to shard over). Adding an axis value is one component and one line here;
a combination no component supports gets a rule in ``distrec.config.COMBINATION_RULES``
(checked when a config loads, and with the world size by ``ParallelSpec.of``). The trainer
(``distrec.train``) asks :func:`build_mode` and knows nothing else of the techniques.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from distrec.config import RunConfig
from distrec.errors import DistrecError
from distrec.hotline.replicated_mode import HotBlockFormat, ReplicatedHotline
from distrec.hotline.tiers_mode import HotlineTiers, TiersFormat
from distrec.parallel.block_mode import BlockFormat
from distrec.parallel.local import LocalEmbeddings
from distrec.parallel.mode import Axis, CheckpointFormat, ParallelMode, RunContext
from distrec.parallel.sharded import Sharded
from distrec.parallel.single import SingleProcess
from distrec.parallel.spec import ParallelSpec, Placement
from distrec.parallel.sptt_mode import Sptt
from distrec.parallel.two_d import ReplicaGroups
from distrec.tables import TableConfig

PLACEMENTS: dict[Placement, type[ParallelMode]] = {
    "single": SingleProcess,
    "sharded": Sharded,
    "sptt": Sptt,
    "local": LocalEmbeddings,
    "hotline-tiers": HotlineTiers,
    "hotline-replicated": ReplicatedHotline,
}
"""The mode of each value of the placement axis."""

AXES: list[Callable[[RunContext, ParallelSpec], Axis | None]] = [
    lambda ctx, spec: ReplicaGroups(ctx, spec) if spec.replica_groups > 1 else None,
]
"""The other axes, in the order they apply: each makes its component for a run, or None."""

FORMATS: dict[str, type[CheckpointFormat]] = {f.tag: f for f in (BlockFormat, HotBlockFormat, TiersFormat)}
"""Every checkpoint format, by the tag written in ``meta.json``."""


def select_mode(cfg: RunConfig, world_size: int) -> type[ParallelMode]:
    """The mode that places the tables of ``cfg`` on ``world_size`` processes.

    Raises:
        DistrecError: naming the first refused combination and what to change.
    """
    return PLACEMENTS[ParallelSpec.of(cfg, world_size).placement]


def check_mode(cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> type[ParallelMode]:
    """``select_mode``, then that mode's own checks of the tables (plan, topology, towers);
    for use before any process starts."""
    mode = select_mode(cfg, world_size)
    mode.check(cfg, world_size, tables)
    return mode


def build_mode(ctx: RunContext) -> ParallelMode:
    """The mode of ``ctx``'s run with the components of its other axes (they may create
    process groups: call it on every rank)."""
    spec = ParallelSpec.of(ctx.cfg, ctx.world_size)
    axes = [axis for make in AXES if (axis := make(ctx, spec)) is not None]
    return PLACEMENTS[spec.placement](ctx, spec, axes)


def format_tag(own: dict[str, Any], meta: dict[str, Any]) -> str:
    """The tag of the format that wrote a checkpoint whose rank 0 saved ``own``: the one in
    ``meta.json``, or, for checkpoints written before formats were tagged, the one their keys show."""
    if "format" in meta:
        return str(meta["format"])
    if "dense" not in own:
        return TiersFormat.tag
    return HotBlockFormat.tag if "hotline" in own else BlockFormat.tag


def saved_format(checkpoint: Path, own: dict[str, Any], meta: dict[str, Any]) -> type[CheckpointFormat]:
    """The format that wrote a checkpoint, which restores a one-process model from it."""
    tag = format_tag(own, meta)
    if tag not in FORMATS:
        raise DistrecError(f"checkpoint {str(checkpoint)!r} has format {tag!r}, which this distrec does not know; use the distrec that wrote it")
    return FORMATS[tag]
