"""Predicted iteration of hybrid-parallel DLRM training: flat, SPTT, DMT, 2D and DMT x 2D.

A scheme is a lookup (flat all-to-all, or DMT's SPTT with tower modules of compression
ratio CR) and a number G of 2D replica groups (1: full sharding over all ranks); its
iteration is compute plus the components of ``distrec.sim.components``, added up (no
overlap of communication and compute):

- ``flat``: flat lookup, G = 1; ``sptt``: SPTT without towers (CR 1); ``dmt``: SPTT with
  towers of ratio CR;
- ``2d``: flat lookup inside G groups (contiguous or strided, see ``components.Groups``);
  ``dmt-2d``: DMT inside G contiguous groups of whole hosts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, get_args

from distrec.errors import DistrecError
from distrec.sim.cluster import Cluster
from distrec.sim.collectives import Traffic
from distrec.sim.components import (
    Groups,
    Layout,
    Lookup,
    ReplicaAverage,
    ReplicaSync,
    compute_ms,
    embedding_exchange,
    gradient_all_reduce,
    index_exchange,
    replica_sync,
)
from distrec.sim.workload import Workload

Scheme = Literal["flat", "sptt", "dmt", "2d", "dmt-2d"]
SCHEMES: tuple[Scheme, ...] = get_args(Scheme)
TWO_D_SCHEMES: tuple[Scheme, ...] = ("2d", "dmt-2d")

__all__ = [
    "SCHEMES",
    "TWO_D_SCHEMES",
    "IterationTime",
    "Prediction",
    "Workload",
    "predict",
    "predict_dmt",
    "predict_flat",
    "predict_iteration",
    "predict_two_d",
]


@dataclass(frozen=True)
class IterationTime:
    """Predicted time of one iteration per component (ms)."""

    compute: float
    index_exchange: float
    embedding_exchange: float
    all_reduce: float
    replica_sync: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class Prediction:
    """One rank's predicted iteration: compute time and each communication component's traffic.

    ``index_exchange + embedding_exchange`` is the embedding all-to-all; ``replica_sync`` is
    per step (a periodic sync's cost divided by K); ``groups`` is G, laid out as ``layout``.
    """

    groups: int
    layout: Layout
    compute_ms: float
    index_exchange: Traffic
    embedding_exchange: Traffic
    replica_sync: Traffic
    all_reduce: Traffic

    @property
    def all_to_all(self) -> Traffic:
        return self.index_exchange + self.embedding_exchange

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.all_to_all.ms + self.replica_sync.ms + self.all_reduce.ms

    def times(self) -> IterationTime:
        """Milliseconds per component."""
        return IterationTime(self.compute_ms, self.index_exchange.ms, self.embedding_exchange.ms, self.all_reduce.ms, self.replica_sync.ms)

    def as_dict(self) -> dict:
        parts = ("index_exchange", "embedding_exchange", "replica_sync", "all_reduce")
        return {
            "groups": self.groups,
            "layout": self.layout,
            "compute_ms": self.compute_ms,
            **{p: getattr(self, p).as_dict() for p in parts},
            "total_ms": self.total_ms,
        }


def predict(
    workload: Workload,
    cluster: Cluster,
    scheme: Scheme,
    *,
    groups: int = 1,
    compression: float = 1.0,
    sync: ReplicaSync = "periodic",
    sync_every: int = 1,
    layout: Layout = "contiguous",
    average: ReplicaAverage = "all",
) -> Prediction:
    """Predicted iteration of ``scheme`` (``groups``, ``sync``, ``sync_every``, ``average`` and ``layout`` for
    2D schemes only; ``compression`` for DMT schemes only)."""
    if scheme not in SCHEMES:
        raise DistrecError(f"unknown scheme {scheme!r}; choose one of: {', '.join(SCHEMES)}")
    if groups != 1 and scheme not in TWO_D_SCHEMES:
        raise DistrecError(f"scheme {scheme!r} has no replica groups; use 2d or dmt-2d for {groups} groups")
    if scheme == "dmt-2d" and layout != "contiguous":
        raise DistrecError("DMT x 2D runs SPTT in groups of whole hosts; use the contiguous layout")
    towers = scheme in ("dmt", "dmt-2d")
    lookup: Lookup = "flat" if scheme in ("flat", "2d") else "sptt"
    placed = Groups.on(cluster, groups, layout)
    return Prediction(
        groups=groups,
        layout=layout,
        compute_ms=compute_ms(workload, cluster, towers),
        index_exchange=index_exchange(workload, cluster, placed),
        embedding_exchange=embedding_exchange(workload, cluster, placed, lookup, compression if towers else 1.0),
        replica_sync=replica_sync(workload, cluster, placed, sync, sync_every, average),
        all_reduce=gradient_all_reduce(workload, cluster, placed, towers),
    )


def predict_flat(workload: Workload, cluster: Cluster) -> Prediction:
    """Full sharding over all ranks with a flat all-to-all."""
    return predict(workload, cluster, "flat")


def predict_dmt(workload: Workload, cluster: Cluster, compression: float) -> Prediction:
    """DMT: SPTT with tower modules of compression ratio ``compression`` (1 without towers' gain)."""
    return predict(workload, cluster, "dmt", compression=compression)


def predict_two_d(
    workload: Workload,
    cluster: Cluster,
    groups: int,
    sync: ReplicaSync = "periodic",
    sync_every: int = 1,
    compression: float | None = None,
    layout: Layout = "contiguous",
    average: ReplicaAverage = "all",
) -> Prediction:
    """2D sparse parallelism with ``groups`` replica groups; with ``compression``, DMT x 2D."""
    scheme: Scheme = "2d" if compression is None else "dmt-2d"
    return predict(workload, cluster, scheme, groups=groups, compression=compression or 1.0, sync=sync, sync_every=sync_every, layout=layout, average=average)


def predict_iteration(workload: Workload, cluster: Cluster, scheme: Scheme, compression: float = 1.0) -> IterationTime:
    """Milliseconds per component of ``scheme`` ("flat", "sptt" or "dmt" with ``compression``)."""
    return predict(workload, cluster, scheme, compression=compression).times()
