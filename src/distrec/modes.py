"""The composition root of the parallel modes: which modes exist, which combinations are
refused, and which mode trains a given config on a given number of processes.

Adding a mode means writing one module with a :class:`~distrec.parallel.mode.ParallelMode`
subclass and naming it in ``MODES``; a combination of settings no mode trains gets a rule in
``distrec.config.COMBINATION_RULES`` (checked when a config loads, and with the world size
here). The trainer (``distrec.train``) asks :func:`select_mode` and knows nothing else of the
techniques.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distrec.config import RunConfig, check_combination
from distrec.errors import DistrecError
from distrec.hotline.replicated_mode import ReplicatedHotline
from distrec.hotline.tiers_mode import HotlineTiers
from distrec.parallel.local import LocalEmbeddings
from distrec.parallel.mode import ParallelMode
from distrec.parallel.sharded import Sharded
from distrec.parallel.single import SingleProcess
from distrec.parallel.sptt_mode import Sptt, SpttTowers
from distrec.parallel.two_d import TwoD, TwoDSptt, TwoDSpttTowers
from distrec.tables import TableConfig

MODES: list[type[ParallelMode]] = [
    HotlineTiers,
    ReplicatedHotline,
    SingleProcess,
    TwoDSpttTowers,
    TwoDSptt,
    SpttTowers,
    Sptt,
    LocalEmbeddings,
    TwoD,
    Sharded,
]
"""Every mode, in the order they are asked whether they train a config (the first that accepts does)."""


def select_mode(cfg: RunConfig, world_size: int) -> type[ParallelMode]:
    """The mode that trains ``cfg`` on ``world_size`` processes.

    Raises:
        DistrecError: naming the first refused combination and what to change.
    """
    check_combination(cfg, world_size)
    return next(mode for mode in MODES if mode.accepts(cfg, world_size))


def check_mode(cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> type[ParallelMode]:
    """``select_mode``, then that mode's own checks of the tables (plan, topology, towers);
    for use before any process starts."""
    mode = select_mode(cfg, world_size)
    mode.check(cfg, world_size, tables)
    return mode


def saved_by(checkpoint: Path, own: dict[str, Any], meta: dict[str, Any]) -> type[ParallelMode]:
    """The kind of mode that wrote a checkpoint (``own``: its rank 0 state), which restores a
    one-process model from it (``restored_tables``, ``restore_model``)."""
    writer = next((mode for mode in MODES if mode.wrote(own, meta)), None)
    if writer is None:
        raise DistrecError(f"checkpoint {str(checkpoint)!r} was written by no mode this distrec knows; use the distrec that wrote it")
    return writer
