"""Topology: ranks laid out as hosts x ranks per host, and the process groups that follow it.

Rank g lives on host ``g // L`` with local rank ``g % L`` (L = ranks per host), which is
how torchrun numbers ranks (node rank x local world size + local rank). The **peers** of a
rank are the ranks with its local rank on every host; **peer order** sorts all ranks by
(local rank, host). SPTT (``distrec.parallel.sptt``) talks inside a host over the
intra-host group and across hosts only among peers. A tower may span K hosts
(``Topology.tower_topology``): SPTT then runs on the topology of towers, whose "hosts" are
the towers, each of K x L ranks.

Example:
    >>> t = Topology(hosts=2, ranks_per_host=3)
    >>> t.host(4), t.local_rank(4), t.peers(4)
    (1, 1, [1, 4])
    >>> t.peer_order
    [0, 3, 1, 4, 2, 5]
    >>> Topology(hosts=4, ranks_per_host=2).tower_topology(2)
    Topology(hosts=2, ranks_per_host=4)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from distrec.errors import DistrecError


@dataclass(frozen=True)
class TopologyGroups:
    """This rank's process groups: its host's ranks and its peers (one rank per host).

    Attributes:
        rank: this process's rank in the topology (its global rank, unless the world holds
            several copies of the topology).
        intra_host: group of the ranks on this rank's host (group rank = local rank).
        cross_host: group of this rank's peers (group rank = host).
        everyone: group of every rank of the topology (None: the default group).
    """

    rank: int
    intra_host: Any
    cross_host: Any
    everyone: Any = None


@dataclass(frozen=True)
class Topology:
    """A cluster of ``hosts`` hosts with ``ranks_per_host`` ranks (GPUs or processes) each."""

    hosts: int
    ranks_per_host: int

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.ranks_per_host < 1:
            raise DistrecError(f"topology {self.hosts} hosts x {self.ranks_per_host} ranks per host is invalid; both must be at least 1")

    @property
    def world_size(self) -> int:
        return self.hosts * self.ranks_per_host

    def host(self, rank: int) -> int:
        return self._checked(rank) // self.ranks_per_host

    def local_rank(self, rank: int) -> int:
        return self._checked(rank) % self.ranks_per_host

    def rank(self, host: int, local_rank: int) -> int:
        """The global rank of ``local_rank`` on ``host``."""
        if not (0 <= host < self.hosts and 0 <= local_rank < self.ranks_per_host):
            raise IndexError(f"host {host}, local rank {local_rank} outside {self.hosts}x{self.ranks_per_host}")
        return host * self.ranks_per_host + local_rank

    def host_ranks(self, host: int) -> list[int]:
        """The ranks on ``host``, by local rank."""
        return [self.rank(host, l) for l in range(self.ranks_per_host)]

    def peers(self, rank: int) -> list[int]:
        """The ranks sharing ``rank``'s local rank (including ``rank``), by host."""
        local = self.local_rank(rank)
        return [self.rank(h, local) for h in range(self.hosts)]

    @property
    def peer_order(self) -> list[int]:
        """All ranks sorted by (local rank, host)."""
        return [self.rank(h, l) for l in range(self.ranks_per_host) for h in range(self.hosts)]

    def tower_topology(self, hosts_per_tower: int) -> Topology:
        """The topology of towers of ``hosts_per_tower`` (K) consecutive hosts each: tower t is
        one "host" of K x L ranks (ranks ``t*K*L .. (t+1)*K*L - 1``), so there are hosts / K
        towers and SPTT's intra-host step runs inside a tower, across its K hosts."""
        if hosts_per_tower < 1 or self.hosts % hosts_per_tower != 0:
            raise DistrecError(
                f"--hosts-per-tower {hosts_per_tower} must divide the {self.hosts} hosts (towers = hosts / K); change --hosts-per-tower or --hosts"
            )
        return Topology(self.hosts // hosts_per_tower, self.ranks_per_host * hosts_per_tower)

    def check_world_size(self, world_size: int) -> None:
        """Raise DistrecError unless ``world_size`` equals hosts x ranks per host."""
        if world_size != self.world_size:
            raise DistrecError(
                f"topology {self.hosts}x{self.ranks_per_host} needs {self.world_size} ranks but the job has "
                f"{world_size}; set --hosts and --ranks-per-host so that their product is the world size"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Topology:
        """The topology torchrun describes in WORLD_SIZE and LOCAL_WORLD_SIZE.

        RANK and LOCAL_RANK, when set, must follow torchrun's host-major numbering.
        """
        env = os.environ if env is None else env
        world = _env_int(env, "WORLD_SIZE")
        local = _env_int(env, "LOCAL_WORLD_SIZE")
        if world % local != 0:
            raise DistrecError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local}; launch the same --nproc-per-node on every host")
        topology = cls(hosts=world // local, ranks_per_host=local)
        if "RANK" in env and "LOCAL_RANK" in env:
            rank, local_rank = _env_int(env, "RANK"), _env_int(env, "LOCAL_RANK")
            if rank >= world or topology.local_rank(rank) != local_rank:
                raise DistrecError(
                    f"RANK={rank} with LOCAL_RANK={local_rank} does not follow host-major numbering "
                    f"(local rank = rank % {local}); launch with torchrun or pass --hosts/--ranks-per-host"
                )
        return topology

    def build_groups(self, backend: str | None = None, copies: int = 1) -> TopologyGroups:
        """Create the intra-host and cross-host (peer) process groups; return this rank's.

        With ``copies`` > 1 the world is that many copies of this topology on consecutive
        ranks (2D sparse parallelism's replica groups, ``distrec.parallel.two_d``): each copy
        gets its own groups, and a rank's ``rank`` counts within its copy.

        ``torch.distributed.new_group`` is collective: every rank of the job must call it for
        every group, in the same order, even for groups it is not in. This method does so
        (by copy: all host groups by host, then all peer groups by local rank), so every rank
        must call it exactly once, at the same point of the program, and keep the result.
        """
        self.check_world_size(dist.get_world_size() // copies)
        copy, rank = divmod(dist.get_rank(), self.world_size)
        built = []
        for first in range(0, copies * self.world_size, self.world_size):
            host_groups = [dist.new_group([first + r for r in self.host_ranks(h)], backend=backend) for h in range(self.hosts)]
            peer_groups = [dist.new_group([first + r for r in self.peers(self.rank(0, l))], backend=backend) for l in range(self.ranks_per_host)]
            everyone = dist.new_group(list(range(first, first + self.world_size)), backend=backend) if copies > 1 else None
            built.append(TopologyGroups(rank, host_groups[self.host(rank)], peer_groups[self.local_rank(rank)], everyone))
        return built[copy]

    def _checked(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} outside 0..{self.world_size - 1}")
        return rank


def _env_int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None:
        raise DistrecError(f"{name} is not set; launch with torchrun or pass --hosts and --ranks-per-host")
    try:
        number = int(value)
    except ValueError:
        raise DistrecError(f"{name}={value!r} is not an integer; fix the launcher's environment") from None
    if number < (0 if name in ("RANK", "LOCAL_RANK") else 1):
        raise DistrecError(f"{name}={number} is out of range; fix the launcher's environment")
    return number
