"""SingleProcess: the model as built, trained in one process (DMT's tower modules included)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from distrec.config import ParallelConfig, RunConfig
from distrec.models.base import RecommendationModel
from distrec.parallel.block_mode import BlockMode
from distrec.parallel.mode import Axis, ModelLayout, RunContext
from distrec.parallel.spec import ParallelSpec
from distrec.tables import TableConfig
from distrec.tower_partition import resolve_towers

log = logging.getLogger(__name__)

MULTI_PROCESS_SETTINGS: dict[str, Callable[[ParallelConfig], bool]] = {
    "--plan": lambda p: p.plan is not None,
    "--sharding": lambda p: p.sharding is not None,
    "--memory-per-rank": lambda p: p.memory_per_rank is not None,
    "--embeddings local": lambda p: p.embeddings == "local",
    "--lookup sptt": lambda p: p.lookup == "sptt",
    "--replica-groups": lambda p: p.replica_groups > 1,
}
"""Settings a one-process run cannot use, as the command line names them."""


class SingleProcess(BlockMode):
    """One process, whole tables: the reference every other mode must equal.

    A DMT model's towers come from ``parallel.towers``, else strided over ``parallel.tower_count``.
    """

    name = "single"
    embeddings = "single"

    def __init__(self, ctx: RunContext, spec: ParallelSpec, axes: list[Axis] | None = None) -> None:
        super().__init__(ctx, spec, axes)
        p = ctx.cfg.parallel
        ignored = [flag for flag, given in MULTI_PROCESS_SETTINGS.items() if given(p)]
        if ignored:
            log.warning(f"ignored in one process: {', '.join(ignored)} (multi-process settings); add --nproc-per-node N to use them")
        names = [t.name for t in ctx.tables]
        self._towers = resolve_towers(names, p.towers, p.tower_count) if ctx.cfg.model.tower_module is not None else None

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        if cfg.model.tower_module is not None:
            resolve_towers([t.name for t in tables], cfg.parallel.towers, cfg.parallel.tower_count)

    def model_layout(self) -> ModelLayout:
        return ModelLayout(self.ctx.tables, self._towers)

    def shard_embeddings(self, model: RecommendationModel) -> None:
        """Nothing to shard: the one process holds the whole tables."""
