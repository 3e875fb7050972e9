"""Cost models of the collectives (seconds), built from ``LinkParams``.

All-to-all: every GPU sends one message to each other member; messages over the two link
classes travel at the same time, so a flat all-to-all over a multi-host cluster takes the
longer of its intra-host and cross-host parts. Ring all-reduce of S bytes over n members:
``2 (n - 1)`` steps of ``S / n`` bytes (Patarasuk and Yuan, 2009). Hierarchical all-reduce:
reduce-scatter and all-gather inside each host, a ring all-reduce of ``S / L`` bytes among
peers across hosts.
"""

from __future__ import annotations

from distrec.errors import DistrecError
from distrec.sim.cluster import Cluster, LinkParams

ALL_REDUCE_ALGORITHMS = ("ring", "hierarchical")


def all_to_all_time(link: LinkParams, peers: int, bytes_per_peer: float) -> float:
    """An all-to-all over one link class: ``peers`` messages of ``bytes_per_peer`` each."""
    return link.time_s(peers * bytes_per_peer, messages=peers) if peers > 0 else 0.0


def flat_all_to_all_time(cluster: Cluster, bytes_per_peer: float) -> float:
    """An all-to-all over all GPUs: L - 1 messages inside the host, N - L across hosts."""
    local = cluster.gpus_per_host
    return max(
        all_to_all_time(cluster.scale_up, local - 1, bytes_per_peer),
        all_to_all_time(cluster.scale_out, cluster.num_gpus - local, bytes_per_peer),
    )


def ring_all_reduce_time(link: LinkParams, members: int, num_bytes: float) -> float:
    """Ring all-reduce of ``num_bytes`` over ``members`` GPUs on one link class."""
    if members <= 1 or num_bytes <= 0:
        return 0.0
    return 2 * (members - 1) * link.time_s(num_bytes / members)


def all_reduce_time(cluster: Cluster, num_bytes: float, algorithm: str = "hierarchical") -> float:
    """All-reduce of ``num_bytes`` over all GPUs.

    ``ring``: one ring through every GPU, each step bounded by the cross-host link when
    there are several hosts. ``hierarchical``: a ring inside each host, then a ring of
    ``num_bytes / L`` among peers across hosts.
    """
    if algorithm == "ring":
        link = cluster.scale_out if cluster.hosts > 1 else cluster.scale_up
        return ring_all_reduce_time(link, cluster.num_gpus, num_bytes)
    if algorithm == "hierarchical":
        local = cluster.gpus_per_host
        return ring_all_reduce_time(cluster.scale_up, local, num_bytes) + ring_all_reduce_time(cluster.scale_out, cluster.hosts, num_bytes / local)
    raise DistrecError(f"unknown all-reduce algorithm {algorithm!r}; choose one of: {', '.join(ALL_REDUCE_ALGORITHMS)}")
