"""One rank's traffic per training step, component by component (``Traffic`` of each).

N = H x L ranks (H hosts of L) form G replica groups of S = N / G ranks (G = 1: plain full
sharding), laid out as ``Groups`` says. Every group holds all F tables, F / S per rank (fractional when S > F:
column-wise shards, which exchange the same bytes); b samples per rank, D floats per
embedding, e bytes per float, i bytes per index, pooling p. Bytes and rows are means over
the ranks of a group (what a balanced plan gives each rank):

- index exchange (distrec's input all-to-all over the S ranks of the group): the split
  counts (2 indices per peer), the bag lengths (``b F/S`` per peer) and the indices
  (``b F/S p`` per peer), three all-to-alls;
- embedding exchange, forward and again backward (the gradients):
  ``flat`` lookup: one all-to-all of ``b F/S D e`` bytes per peer over the group;
  ``sptt`` lookup (DMT; contiguous groups of h = S / L whole hosts): an intra-host all-to-all of
  ``h b F/S D e`` bytes to each of L - 1 peers, then a cross-host one of
  ``b F/h D e / CR`` bytes to each of h - 1 peers (CR = 1: SPTT);
- replica sync among the G ranks that hold the same shard (rank s of every group):
  ``exact``: every step, ring all-gathers of the entry counts, the touched row ids and their
  gradient rows (``average_sparse_grads``); a table of R rows sees ``S b p`` lookups in a
  group's step, ``R (1 - (1 - 1/R)^(S b p))`` distinct rows in expectation under uniform
  access, fewer under the workload's Zipf access (``sum_i 1 - (1 - p_i)^(S b p)``), and a
  rank holds 1/S of the tables' sum;
  ``periodic``: every K steps, divided by K: averaging ``all`` rows, one all-reduce per table
  shard (``ceil(F/S)`` per rank) of its weights and one of its row-wise optimizer state (1/S
  of all rows, times D and times ``row_state_floats`` floats); merging ``touched`` rows,
  all-gathers of a count, then the ids and the change, touch count and state of the rows the
  group touched in the K steps (distinct rows of K steps' lookups, as above), and
  ``Cluster.row_merge_s`` for each of them;
- all-reduce: the dense gradients over all N ranks (as one all-reduce; DDP's buckets split
  it into more messages); DMT's tower-module gradients over the L ranks of a host and the
  same host of every group (G hosts).

Compute: dense forward + backward = 3 x forward FLOPs at ``peak x efficiency``; DMT adds
its tower modules (b samples' worth of all towers' FLOPs per GPU). Lookups and optimizer
steps are left out (the same in every scheme).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from distrec.errors import DistrecError
from distrec.sim.cluster import Cluster
from distrec.sim.collectives import Traffic, all_gather, all_reduce, all_to_all, exchange, members_per_host, wait
from distrec.sim.workload import Workload
from distrec.tables import exchanged_index_bytes

Lookup = Literal["flat", "sptt"]
ReplicaSync = Literal["exact", "periodic"]
REPLICA_SYNCS: tuple[ReplicaSync, ...] = get_args(ReplicaSync)
ReplicaAverage = Literal["all", "touched"]
"""How a periodic sync merges a row: the mean over all groups, or from the groups that touched
it (their changes and three columns of touch counts travel with the weights)."""
Layout = Literal["contiguous", "strided"]
LAYOUTS: tuple[Layout, ...] = get_args(Layout)


@dataclass(frozen=True)
class Groups:
    """Where the G replica groups of S ranks sit on the cluster.

    ``contiguous`` (distrec's ``--replica-groups``): group g is ranks ``g S .. (g + 1) S - 1``,
    so it fills S / L whole hosts (or shares a host when S < L), and the G replicas of a
    shard sit on different hosts. ``strided`` (TorchRec's ``DMPCollection``): group g is
    ranks ``g, g + G, g + 2 G, ...``, so the replicas of a shard are G consecutive ranks, on
    one host when G <= L, and a group has L / G ranks on every host.

    Attributes:
        count: G.
        size: S = N / G.
        group_per_host: ranks of one group on each host it uses.
        replicas_per_host: ranks of one replica set on each host it uses.
    """

    count: int
    size: int
    group_per_host: int
    replicas_per_host: int

    @classmethod
    def on(cls, cluster: Cluster, count: int, layout: Layout = "contiguous") -> Groups:
        """``count`` groups on ``cluster``, checked to tile its hosts."""
        n, local = cluster.num_gpus, cluster.gpus_per_host
        if count < 1 or n % count:
            raise DistrecError(f"{count} replica groups do not divide {n} GPUs; use a divisor of {n}")
        size = n // count
        if layout == "contiguous":
            members_per_host(cluster, size)
            return cls(count, size, min(size, local), max(1, local // size))
        if layout == "strided":
            if count % local and local % count:
                raise DistrecError(f"{count} strided replica groups do not tile hosts of {local} GPUs; use a G that divides {local} or is a multiple of it")
            return cls(count, size, max(1, local // count), min(count, local))
        raise DistrecError(f"unknown replica layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")

    @property
    def group_hosts(self) -> int:
        return self.size // self.group_per_host

    @property
    def replica_hosts(self) -> int:
        return self.count // self.replicas_per_host


def compute_ms(workload: Workload, cluster: Cluster, towers: bool) -> float:
    """Dense (and, with ``towers``, tower-module) forward and backward of b samples (ms)."""
    w = workload
    mflops = w.dense_mflops + (w.tower_mflops if towers else 0.0)
    return 1e3 * 3 * mflops * 1e6 * w.local_batch / (cluster.peak_flops * cluster.compute_efficiency)


def index_exchange(workload: Workload, cluster: Cluster, groups: Groups) -> Traffic:
    """The input all-to-all of one step: the split counts (two int64 per peer), then the bag
    lengths and indices to the group in one message, int32 when every table's rows fit (as
    ``ShardedEmbeddingBagCollection`` sends them)."""
    w, size, per_host = workload, groups.size, groups.group_per_host
    bags = w.local_batch * w.num_features / size
    index_bytes = exchanged_index_bytes(w.rows_per_table())
    return all_to_all(cluster, size, 2 * 8, per_host) + all_to_all(cluster, size, bags * (1 + w.pooling) * index_bytes, per_host)


def embedding_exchange(workload: Workload, cluster: Cluster, groups: Groups, lookup: Lookup = "flat", compression: float = 1.0) -> Traffic:
    """Pooled embeddings forward and their gradients backward within the group."""
    if not 0 < compression < math.inf:
        raise DistrecError(f"compression {compression} is invalid; give a positive finite ratio, e.g. 4")
    w, c, size = workload, cluster, groups.size
    row_bytes = w.local_batch * w.num_features / size * w.embedding_dim * w.bytes_per_float
    if lookup == "flat":
        return all_to_all(c, size, row_bytes, groups.group_per_host) * 2
    if lookup != "sptt":
        raise DistrecError(f"unknown lookup {lookup!r}; choose flat or sptt")
    if groups.group_per_host != c.gpus_per_host:
        raise DistrecError(f"SPTT needs whole hosts in each group; use contiguous groups and at most {c.hosts} replica groups for {c.hosts} hosts")
    hosts = groups.group_hosts
    intra = exchange(c.scale_up, c.gpus_per_host - 1, hosts * row_bytes, cross_host=False)
    cross = exchange(c.scale_out, hosts - 1, w.local_batch * w.num_features / hosts * w.embedding_dim * w.bytes_per_float / compression, cross_host=True)
    return (intra + cross + wait(c) * ((c.gpus_per_host > 1) + (hosts > 1))) * 2  # an all-to-all inside hosts, then one among peers


def distinct_rows(lookups: float, rows: int, zipf_exponent: float = 0.0) -> float:
    """Expected distinct rows among ``lookups`` independent draws from ``rows`` rows, row i
    (1-based) drawn with probability proportional to ``i ** -zipf_exponent`` (0: uniform):
    the sum over rows of ``1 - (1 - p_i) ** lookups``."""
    if rows <= 1:
        return float(lookups > 0)
    if zipf_exponent == 0:
        return rows * -math.expm1(lookups * math.log1p(-1.0 / rows))
    return _zipf_distinct_rows(float(lookups), int(rows), float(zipf_exponent))


@functools.lru_cache(maxsize=256)
def _zipf_distinct_rows(lookups: float, rows: int, exponent: float) -> float:
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -exponent
    return float(-np.expm1(lookups * np.log1p(-weights / weights.sum())).sum())


def touched_rows(workload: Workload, size: int, steps: int = 1) -> float:
    """Rows of one rank's shard that its group of ``size`` ranks touches in ``steps`` steps
    (expected under the workload's access distribution; the mean over the group's ranks)."""
    w = workload
    return sum(distinct_rows(size * w.local_batch * w.pooling * steps, rows, w.zipf_exponent) for rows in w.rows_per_table()) / size


def replica_sync(
    workload: Workload, cluster: Cluster, groups: Groups, sync: ReplicaSync = "periodic", sync_every: int = 1, average: ReplicaAverage = "all"
) -> Traffic:
    """Keeping the G replicas consistent, per step (``periodic``: one sync per ``sync_every`` steps, averaging as ``average`` says)."""
    if sync not in REPLICA_SYNCS:
        raise DistrecError(f"unknown replica sync {sync!r}; choose one of: {', '.join(REPLICA_SYNCS)}")
    if sync_every < 1:
        raise DistrecError(f"sync every {sync_every} steps is invalid; use K >= 1")
    w, c, size = workload, cluster, groups.size
    if groups.count == 1:
        return Traffic()
    per_host, hosts = groups.replicas_per_host, groups.replica_hosts
    tables = math.ceil(w.num_features / size)
    if sync == "exact":
        rows = touched_rows(w, size)
        return (
            all_gather(c, tables * w.bytes_per_index, hosts, per_host)
            + all_gather(c, rows * w.bytes_per_index, hosts, per_host)
            + all_gather(c, rows * w.embedding_dim * w.bytes_per_float, hosts, per_host)
        )
    if average == "touched":  # the rows each group touched since the last sync: their count, ids, change, touch count and state
        rows = touched_rows(w, size, sync_every)
        floats = w.embedding_dim + 1 + w.row_state_floats
        sync = all_gather(c, w.bytes_per_index, hosts, per_host) + all_gather(c, rows * w.bytes_per_index, hosts, per_host)
        merging = Traffic(ms=1e3 * rows * c.row_merge_s)
        return (sync + all_gather(c, rows * floats * w.bytes_per_float, hosts, per_host) + merging) * (1 / sync_every)
    rows_per_table = sum(w.rows_per_table()) / size / tables  # one all-reduce per table shard and tensor
    weights = all_reduce(c, rows_per_table * w.embedding_dim * w.bytes_per_float, hosts, per_host)
    state = all_reduce(c, rows_per_table * w.row_state_floats * w.bytes_per_float, hosts, per_host) if w.row_state_floats else Traffic()
    return (weights + state) * (tables / sync_every)


def gradient_all_reduce(workload: Workload, cluster: Cluster, groups: Groups, towers: bool = False) -> Traffic:
    """The dense gradients over all ranks; with ``towers``, the tower modules' over their
    replicas (the same host of every contiguous group)."""
    w, c = workload, cluster
    dense = all_reduce(c, 4 * w.dense_params, c.hosts, c.gpus_per_host)
    if not towers:
        return dense
    return dense + all_reduce(c, 4 * w.tower_params, groups.count, c.gpus_per_host)
