"""One rank's traffic per training step, component by component (``Traffic`` of each).

N = H x L ranks (H hosts of L) form G replica groups of S = N / G consecutive ranks (G = 1:
plain full sharding). Every group holds all F tables, F / S per rank (fractional when S > F:
column-wise shards, which exchange the same bytes); b samples per rank, D floats per
embedding, e bytes per float, i bytes per index, pooling p. Bytes and rows are means over
the ranks of a group (what a balanced plan gives each rank):

- index exchange (distrec's input all-to-all over the S ranks of the group): the split
  counts (2 indices per peer), the bag lengths (``b F/S`` per peer) and the indices
  (``b F/S p`` per peer), three all-to-alls;
- embedding exchange, forward and again backward (the gradients):
  ``flat`` lookup: one all-to-all of ``b F/S D e`` bytes per peer over the group;
  ``sptt`` lookup (DMT; the group spans S / L = h hosts): an intra-host all-to-all of
  ``h b F/S D e`` bytes to each of L - 1 peers, then a cross-host one of
  ``b F/h D e / CR`` bytes to each of h - 1 peers (CR = 1: SPTT);
- replica sync among the G ranks that hold the same shard (rank s of every group; one per
  host when S >= L):
  ``exact``: every step, ring all-gathers of the entry counts, the touched row ids and their
  gradient rows (``average_sparse_grads``); a table of R rows sees ``S b p`` lookups in a
  group's step, ``R (1 - (1 - 1/R)^(S b p))`` distinct rows in expectation under uniform
  access (an upper bound for skewed real data), and a rank holds 1/S of the tables' sum;
  ``periodic``: every K steps, one all-reduce per table shard (``ceil(F/S)`` per rank) of
  its weights and one of its row-wise optimizer state (1/S of all rows, times D and times
  ``row_state_floats`` floats), divided by K;
- all-reduce: the dense gradients over all N ranks (as one all-reduce; DDP's buckets split
  it into more messages); DMT's tower-module gradients over the L ranks of a host and the
  same host of every group (G hosts).

Compute: dense forward + backward = 3 x forward FLOPs at ``peak x efficiency``; DMT adds
its tower modules (b samples' worth of all towers' FLOPs per GPU). Lookups and optimizer
steps are left out (the same in every scheme).
"""

from __future__ import annotations

import math
from typing import Literal

from distrec.errors import DistrecError
from distrec.sim.cluster import Cluster
from distrec.sim.collectives import Traffic, all_gather, all_reduce, all_to_all, exchange, members_per_host
from distrec.sim.workload import Workload

Lookup = Literal["flat", "sptt"]
ReplicaSync = Literal["exact", "periodic"]
REPLICA_SYNCS: tuple[ReplicaSync, ...] = ("exact", "periodic")


def group_size(cluster: Cluster, groups: int) -> int:
    """S = N / G, checked to tile the hosts."""
    if groups < 1 or cluster.num_gpus % groups:
        raise DistrecError(f"{groups} replica groups do not divide {cluster.num_gpus} GPUs; use a divisor of {cluster.num_gpus}")
    size = cluster.num_gpus // groups
    members_per_host(cluster, size)
    return size


def compute_ms(workload: Workload, cluster: Cluster, towers: bool) -> float:
    """Dense (and, with ``towers``, tower-module) forward and backward of b samples (ms)."""
    w = workload
    mflops = w.dense_mflops + (w.tower_mflops if towers else 0.0)
    return 1e3 * 3 * mflops * 1e6 * w.local_batch / (cluster.peak_flops * cluster.compute_efficiency)


def index_exchange(workload: Workload, cluster: Cluster, groups: int = 1) -> Traffic:
    """The input all-to-all of one step: split counts, bag lengths and indices to the group."""
    w, size = workload, group_size(cluster, groups)
    bags = w.local_batch * w.num_features / size
    return (
        all_to_all(cluster, size, 2 * w.bytes_per_index)
        + all_to_all(cluster, size, bags * w.bytes_per_index)
        + all_to_all(cluster, size, bags * w.pooling * w.bytes_per_index)
    )


def embedding_exchange(workload: Workload, cluster: Cluster, groups: int = 1, lookup: Lookup = "flat", compression: float = 1.0) -> Traffic:
    """Pooled embeddings forward and their gradients backward within the group."""
    if compression <= 0:
        raise DistrecError(f"compression {compression} must be positive")
    w, c, size = workload, cluster, group_size(cluster, groups)
    row_bytes = w.local_batch * w.num_features / size * w.embedding_dim * w.bytes_per_float
    if lookup == "flat":
        return all_to_all(c, size, row_bytes) * 2
    if lookup != "sptt":
        raise DistrecError(f"unknown lookup {lookup!r}; choose flat or sptt")
    if size < c.gpus_per_host:
        raise DistrecError(f"SPTT needs whole hosts in each group; use at most {c.hosts} replica groups for {c.hosts} hosts")
    hosts = size // c.gpus_per_host
    intra = exchange(c.scale_up, c.gpus_per_host - 1, hosts * row_bytes, cross_host=False)
    cross = exchange(c.scale_out, hosts - 1, w.local_batch * w.num_features / hosts * w.embedding_dim * w.bytes_per_float / compression, cross_host=True)
    return (intra + cross) * 2


def distinct_rows(lookups: float, rows: int) -> float:
    """Expected distinct rows among ``lookups`` uniform draws from ``rows`` rows."""
    return rows * -math.expm1(lookups * math.log1p(-1.0 / rows)) if rows > 1 else float(lookups > 0)


def touched_rows(workload: Workload, cluster: Cluster, groups: int) -> float:
    """Rows of one rank's shard that its group touches in one step (expected under uniform
    access; the mean over the group's ranks)."""
    w, size = workload, group_size(cluster, groups)
    return sum(distinct_rows(size * w.local_batch * w.pooling, rows) for rows in w.rows_per_table()) / size


def replica_sync(workload: Workload, cluster: Cluster, groups: int, sync: ReplicaSync = "periodic", sync_every: int = 1) -> Traffic:
    """Keeping the G replicas consistent, per step (``periodic``: one sync per ``sync_every`` steps)."""
    if sync not in REPLICA_SYNCS:
        raise DistrecError(f"unknown replica sync {sync!r}; choose one of: {', '.join(REPLICA_SYNCS)}")
    if sync_every < 1:
        raise DistrecError(f"sync every {sync_every} steps is invalid; use K >= 1")
    w, c, size = workload, cluster, group_size(cluster, groups)
    if groups == 1:
        return Traffic()
    per_host = max(1, c.gpus_per_host // size)  # replicas of a shard that share a host
    hosts = groups // per_host
    tables = math.ceil(w.num_features / size)
    if sync == "exact":
        rows = touched_rows(w, c, groups)
        return (
            all_gather(c, tables * w.bytes_per_index, hosts, per_host)
            + all_gather(c, rows * w.bytes_per_index, hosts, per_host)
            + all_gather(c, rows * w.embedding_dim * w.bytes_per_float, hosts, per_host)
        )
    rows_per_table = sum(w.rows_per_table()) / size / tables  # one all-reduce per table shard and tensor
    weights = all_reduce(c, rows_per_table * w.embedding_dim * w.bytes_per_float, hosts, per_host)
    state = all_reduce(c, rows_per_table * w.row_state_floats * w.bytes_per_float, hosts, per_host) if w.row_state_floats else Traffic()
    return (weights + state) * (tables / sync_every)


def gradient_all_reduce(workload: Workload, cluster: Cluster, groups: int = 1, towers: bool = False) -> Traffic:
    """The dense gradients over all ranks; with ``towers``, the tower modules' over their replicas."""
    w, c = workload, cluster
    group_size(c, groups)
    dense = all_reduce(c, 4 * w.dense_params, c.hosts, c.gpus_per_host)
    if not towers:
        return dense
    return dense + all_reduce(c, 4 * w.tower_params, groups, c.gpus_per_host)
