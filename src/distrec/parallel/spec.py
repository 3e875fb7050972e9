"""ParallelSpec: a run's parallelism as independent axes, validated once.

A run is one value on each axis, whatever the others hold:

- ``replica_groups`` G: 2D sparse parallelism (1: none); the tables are sharded within
  groups of N / G ranks and replicated across them (``distrec.parallel.two_d``);
- ``placement``: where the tables live and how lookups reach them: whole in one process
  (``single``), sharded by a plan with the flat all-to-all (``sharded``), by tower over hosts
  exchanged by SPTT (``sptt``), a full copy per rank (``local``), or Hotline's tiers in one
  process (``hotline-tiers``) or its replicated hot rows over many (``hotline-replicated``);
- ``tower_modules``: DMT's tower modules compress each tower's embeddings (a model
  setting; only placements that place tables by tower run them across processes).

torchtitan's ``ParallelDims`` is the model: the degrees are checked once (G divides the
world size), the combinations no component supports are refused in one line
(``distrec.config.COMBINATION_RULES``), and each axis is applied by one component in a fixed
order (``distrec.modes.build_mode``). With G > 1 the ranks form a ``DeviceMesh`` of G
replica groups x S ranks, whose dimensions give the shard groups and the replica sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from distrec.config import RunConfig, check_combination

Placement = Literal["single", "sharded", "sptt", "local", "hotline-tiers", "hotline-replicated"]
"""Where the tables live and how lookups reach them (see the module doc)."""


@dataclass(frozen=True)
class ParallelSpec:
    """The axes of one run on ``world_size`` processes (build it with :meth:`of`)."""

    world_size: int
    replica_groups: int
    """G: replica groups of ``world_size / G`` consecutive ranks (1: no 2D sparse parallelism)."""
    placement: Placement
    tower_modules: bool
    """Whether the model has DMT's tower modules."""

    @property
    def group_size(self) -> int:
        """S: the ranks of one replica group, over which the tables are sharded."""
        return self.world_size // self.replica_groups

    @classmethod
    def of(cls, cfg: RunConfig, world_size: int) -> ParallelSpec:
        """The spec of ``cfg`` on ``world_size`` processes.

        Raises:
            DistrecError: naming the first refused combination and what to change.
        """
        check_combination(cfg, world_size)
        return cls(world_size, cfg.parallel.replica_groups, placement_of(cfg, world_size), cfg.model.tower_module is not None)


def placement_of(cfg: RunConfig, world_size: int) -> Placement:
    """The placement axis of ``cfg`` on ``world_size`` processes (the settings are checked)."""
    if cfg.hotline.enabled:
        return "hotline-tiers" if world_size == 1 else "hotline-replicated"
    if world_size == 1:
        return "single"
    if cfg.parallel.embeddings == "local":
        return "local"
    return "sptt" if cfg.parallel.lookup == "sptt" else "sharded"
