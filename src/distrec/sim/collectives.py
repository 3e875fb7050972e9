"""What one rank sends in a collective, and how long the collective takes (``Traffic``).

Ranks are numbered host by host; a collective's members are either consecutive ranks (an
all-to-all inside a 2D group) or ``hosts x per_host`` ranks spread evenly over hosts (an
all-reduce or all-gather). Costs follow ``LinkParams.time_s`` (latency per message plus
bytes over effective bandwidth):

- all-to-all: one message to each other member; the intra-host and the cross-host messages
  travel at the same time, so it takes the longer of the two parts;
- ring all-reduce of X bytes over n members: ``2 (n - 1)`` steps of ``X / n`` bytes
  (Patarasuk and Yuan, 2009), each step bounded by the cross-host link when the ring
  leaves the host; only ``hosts`` of its n edges cross hosts;
- hierarchical all-reduce: a ring inside each host, then a ring of ``X / per_host`` bytes
  among peers across hosts;
- tree: the ring inside each host, then a double binary tree of ``X / per_host`` bytes
  across hosts (NCCL's algorithm at scale): ``2 ceil(log2 hosts)`` latencies plus twice
  the bytes over the bandwidth, each rank sending about twice its share;
- auto: the faster of hierarchical and tree, as NCCL's tuner picks by predicted time;
- ring all-gather of X bytes per member: ``n - 1`` steps of X bytes.

Every collective also waits ``Cluster.collective_wait_s`` once, for its last member (``wait``).

A ring's cross-host step runs at one GPU's share of the scale-out link, or with a shared NIC
(``Cluster.shared_nic``) at ``per_host`` shares: the ``gpus_per_host / per_host`` rings side
by side each send one flow out of the host, so they split its NIC among them.

Bytes are those a rank sends to other ranks (its share for itself stays local), averaged
over the members; ``cross_host_bytes`` is the part that leaves the host.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

from distrec.errors import DistrecError
from distrec.sim.cluster import AllReduceAlgorithm, Cluster, LinkParams


@dataclass(frozen=True)
class Traffic:
    """One rank's share of a collective (or of a component of a step).

    Attributes:
        bytes: bytes sent to other ranks.
        messages: messages sent.
        cross_host_bytes: the part of ``bytes`` that leaves the host.
        ms: time the collective takes (milliseconds).
    """

    bytes: float = 0.0
    messages: float = 0.0
    cross_host_bytes: float = 0.0
    ms: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        """Two collectives one after the other."""
        return Traffic(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __mul__(self, factor: float) -> Traffic:
        """``factor`` times the collective (2: forward and backward; 1 / K: once every K steps)."""
        return Traffic(*(getattr(self, f.name) * factor for f in fields(self)))

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def wait(cluster: Cluster) -> Traffic:
    """The wait of one collective for its last member."""
    return Traffic(ms=1e3 * cluster.collective_wait_s)


def exchange(link: LinkParams, peers: int, bytes_per_peer: float, cross_host: bool) -> Traffic:
    """One message of ``bytes_per_peer`` to each of ``peers`` peers over ``link``."""
    if peers <= 0:
        return Traffic()
    sent = peers * bytes_per_peer
    return Traffic(bytes=sent, messages=peers, cross_host_bytes=sent if cross_host else 0.0, ms=1e3 * link.time_s(sent, messages=peers))


def members_per_host(cluster: Cluster, members: int) -> int:
    """How many of ``members`` consecutive ranks share a host (a group fills hosts or fits in one)."""
    local = cluster.gpus_per_host
    if members < 1 or cluster.num_gpus % members or (members % local and local % members):
        raise DistrecError(
            f"a group of {members} ranks does not tile {cluster.hosts} hosts of {local} GPUs; use a group size that divides {local} or is a multiple of it"
        )
    return min(members, local)


def all_to_all(cluster: Cluster, members: int, bytes_per_peer: float, per_host: int | None = None) -> Traffic:
    """An all-to-all among ``members`` ranks, ``bytes_per_peer`` to each other member; ``per_host``
    of them share each host (default: consecutive ranks)."""
    local = members_per_host(cluster, members) if per_host is None else per_host
    intra = exchange(cluster.scale_up, local - 1, bytes_per_peer, cross_host=False)
    cross = exchange(cluster.scale_out, members - local, bytes_per_peer, cross_host=True)
    waited = wait(cluster).ms if members > 1 else 0.0
    return Traffic(intra.bytes + cross.bytes, intra.messages + cross.messages, cross.cross_host_bytes, waited + max(intra.ms, cross.ms))


def ring_link(cluster: Cluster, hosts: int, per_host: int) -> LinkParams:
    """The link one step of a ring through ``hosts x per_host`` ranks runs at (see the module's docstring)."""
    if hosts <= 1:
        return cluster.scale_up
    if cluster.shared_nic:
        return dataclasses.replace(cluster.scale_out, bandwidth=cluster.scale_out.bandwidth * per_host)
    return cluster.scale_out


def ring_all_reduce(cluster: Cluster, num_bytes: float, hosts: int, per_host: int) -> Traffic:
    """Ring all-reduce of ``num_bytes`` over ``hosts x per_host`` ranks, one ring through all."""
    members = hosts * per_host
    if members <= 1 or num_bytes <= 0:
        return Traffic()
    link = ring_link(cluster, hosts, per_host)
    steps, chunk = 2 * (members - 1), num_bytes / members
    sent = steps * chunk
    cross = sent * hosts / members if hosts > 1 else 0.0
    return Traffic(bytes=sent, messages=steps, cross_host_bytes=cross, ms=1e3 * steps * link.time_s(chunk)) + wait(cluster)


def tree_all_reduce(cluster: Cluster, num_bytes: float, hosts: int) -> Traffic:
    """Double-binary-tree all-reduce of ``num_bytes`` among ``hosts`` peers across hosts."""
    if hosts <= 1 or num_bytes <= 0:
        return Traffic()
    link = cluster.scale_out
    depth = math.ceil(math.log2(hosts))
    ms = 1e3 * (2 * depth * link.latency_s + 2 * num_bytes / (link.bandwidth * link.efficiency))
    return Traffic(bytes=2 * num_bytes, messages=4, cross_host_bytes=2 * num_bytes, ms=ms) + wait(cluster)


def all_reduce(cluster: Cluster, num_bytes: float, hosts: int, per_host: int, algorithm: AllReduceAlgorithm | None = None) -> Traffic:
    """All-reduce of ``num_bytes`` over ``hosts x per_host`` ranks (default: the cluster's algorithm)."""
    algorithm = algorithm or cluster.all_reduce_algorithm
    if algorithm == "ring":
        return ring_all_reduce(cluster, num_bytes, hosts, per_host)
    inside = ring_all_reduce(cluster, num_bytes, 1, per_host)
    if algorithm == "hierarchical":
        return inside + ring_all_reduce(cluster, num_bytes / per_host, hosts, 1)
    if algorithm == "tree":
        return inside + tree_all_reduce(cluster, num_bytes / per_host, hosts)
    if algorithm == "auto":
        return min((all_reduce(cluster, num_bytes, hosts, per_host, a) for a in ("hierarchical", "tree")), key=lambda t: t.ms)
    raise DistrecError(f"unknown all-reduce algorithm {algorithm!r}; choose one of: auto, ring, hierarchical, tree")


def all_gather(cluster: Cluster, bytes_per_member: float, hosts: int, per_host: int) -> Traffic:
    """Ring all-gather of ``bytes_per_member`` from each of ``hosts x per_host`` ranks."""
    members = hosts * per_host
    if members <= 1:
        return Traffic()
    link = ring_link(cluster, hosts, per_host)
    steps = members - 1
    sent = steps * bytes_per_member
    cross = sent * hosts / members if hosts > 1 else 0.0
    return Traffic(bytes=sent, messages=steps, cross_host_bytes=cross, ms=1e3 * steps * link.time_s(bytes_per_member)) + wait(cluster)
