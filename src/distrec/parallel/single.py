"""SingleProcess: the model as built, trained in one process (DMT's tower modules included)."""

from __future__ import annotations

from distrec.config import RunConfig
from distrec.parallel.block_mode import BlockMode
from distrec.parallel.mode import RunContext
from distrec.tables import TableConfig
from distrec.towers.partition import resolve_towers


class SingleProcess(BlockMode):
    """One process, whole tables: the reference every other mode must equal.

    A DMT-DLRM's towers come from ``parallel.towers``, else strided over ``parallel.hosts``.
    """

    name = "single"
    embeddings = "single"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        p = ctx.cfg.parallel
        names = [t.name for t in ctx.tables]
        self._towers = resolve_towers(names, p.towers, p.hosts) if ctx.cfg.model.tower_module is not None else None

    @classmethod
    def accepts(cls, cfg: RunConfig, world_size: int) -> bool:
        return world_size == 1

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        if cfg.model.tower_module is not None:
            resolve_towers([t.name for t in tables], cfg.parallel.towers, cfg.parallel.hosts)

    def towers(self) -> list[list[int]] | None:
        return self._towers
