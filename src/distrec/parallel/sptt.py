"""SPTT: the embedding exchange of Disaggregated Multi-Tower (Luo et al., MLSys 2024, Fig. 7).

Both exchanges here start after the lookup: every rank has pooled its own tables for all
``B = world_size x b`` samples of the global batch (SPTT steps (a) + (b)), a tensor
``[B, F_g, D]`` whose rows are the global samples in rank order (rank r's samples are rows
``r*b .. (r+1)*b - 1``) and whose columns are the features ``layout.features_of_rank[g]``.
Both return, on each rank, its own b samples with every feature, ``[b, F, D]`` in the
global feature order.

- ``flat_exchange``: one all-to-all over all ranks (the hybrid-parallel baseline; row-wise
  partial sums are added up after it).
- ``sptt_exchange``: (c) permute the rows into peer order; (d) all-to-all inside the host,
  after which each rank holds its host's features (its tower) for the samples of all its
  peers; (e) reshape (features, peers) -> (peers, features), where an optional tower module
  maps ``[H*b, F_host, D]`` to ``[H*b, out]``; (f) all-to-all among peers (one rank per host).
  Without a tower module the result equals ``flat_exchange``'s exactly, in values and
  gradients; only (f) crosses hosts, in H - 1 messages instead of (H - 1) x L.

Feature mapping (``FeatureLayout.from_towers``): tower t is placed on host t, inside the
host either table-wise (its features split over the host's ranks in contiguous, balanced
runs, so rank ``(t, l)`` pools the l-th run of tower t's features), column-wise (every
rank of the host pools all of tower t's features, rank ``(t, l)`` the l-th range of their
columns) or row-wise (every rank of the host pools all of tower t's features over its range
of their rows: partial sums). A rank's pooled tensor is ``[B, F_rank, D_rank]`` (D_rank = D
unless column-wise), and the exchanges put the received columns back into feature order.

Specialised SPTT (the paper's Sec. 3.1.3), each still equal to ``flat_exchange`` (row-wise:
up to the order in which the partial sums are added):

- a tower spanning K hosts: run on ``Topology.tower_topology(K)``, whose "hosts" are the
  towers; everything below then reads "tower" for "host";
- row-wise tables (all of a tower's, or only the large ones, ``row_wise_features``): step
  (d) adds up their partial sums with a reduce-scatter inside the host
  (``differentiable_reduce_scatter``), the other features still go by the all-to-all;
- one rank per host: (c) and (d) are identities and are skipped; one host: (f) is skipped;
- ``rows_in_peer_order``: the caller pooled its rows in peer order already (the SPTT module
  does so while pooling), so (c) is skipped.

Both exchanges are differentiable (``distrec.parallel.comm.differentiable_all_to_all``: the
backward of each all-to-all is the reverse all-to-all of the gradients). Tensors stay on
the input's device (gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from distrec.errors import DistrecError
from distrec.parallel.comm import differentiable_all_to_all, differentiable_reduce_scatter
from distrec.parallel.topology import Topology, TopologyGroups

TOWER_SHARDINGS = ("table_wise", "column_wise", "row_wise")


@dataclass(frozen=True)
class FeatureLayout:
    """Which features (columns of the global feature order) each rank pools.

    Attributes:
        topology: the cluster.
        features_of_rank: for each rank, the global indices of the features it pools, in
            the order of its pooled tensor's columns. Every feature is on one host; it is on
            one rank, or (column-wise) on every rank of its host.
        columns_of_rank: column-wise only: for each rank, the range ``[start, end)`` of the
            embedding columns it pools (the host's ranks' ranges tile ``[0, D)``); None when
            every rank pools whole features.
        row_wise_features: the features whose tables are split by rows over their host's
            ranks (``distrec.parallel.sptt_embedding.tower_plan`` picks the ranges): every
            rank of the host pools them, after its other features, as partial sums that step
            (d) adds up. Not with column-wise towers.
    """

    topology: Topology
    features_of_rank: tuple[tuple[int, ...], ...]
    columns_of_rank: tuple[tuple[int, int], ...] | None = None
    row_wise_features: frozenset[int] = frozenset()
    _index_by_device: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.features_of_rank) != self.topology.world_size:
            raise DistrecError(
                f"feature layout lists {len(self.features_of_rank)} ranks but the topology has {self.topology.world_size}; build it for this topology"
            )
        order, L = self.exchange_order, self.topology.ranks_per_host
        placed = len(order) * L if self.columns_of_rank is not None else len(order) + (L - 1) * len(self.row_wise_features)
        if sorted(order) != list(range(len(order))) or sum(len(f) for f in self.features_of_rank) != placed:
            raise DistrecError("feature layout must place every feature 0..F-1 on exactly one rank (or host); fix the towers")

    @classmethod
    def from_towers(
        cls, topology: Topology, towers: Sequence[Sequence[int]], sharding: str = "table_wise", dim: int | None = None, row_wise: Sequence[int] = ()
    ) -> FeatureLayout:
        """Tower t on host t, split over the host's ranks ``table_wise`` (contiguous runs of
        features), ``column_wise`` (contiguous, balanced ranges of the ``dim`` columns) or
        ``row_wise`` (ranges of the rows, every rank pooling all of the tower's features);
        with table-wise towers, the features ``row_wise`` (large tables) are split by rows."""
        if sharding not in TOWER_SHARDINGS:
            raise DistrecError(f"tower sharding {sharding!r} is unknown; choose one of: {', '.join(TOWER_SHARDINGS)}")
        if len(towers) != topology.hosts:
            raise DistrecError(
                f"{len(towers)} towers for a topology of {topology.hosts} (one per host, or per --hosts-per-tower hosts); partition the features into {topology.hosts} towers"
            )
        if any(len(tower) == 0 for tower in towers):
            raise DistrecError("a tower has no features; use fewer towers than features so that none is empty")
        if sharding == "column_wise":
            if row_wise:
                raise DistrecError("column-wise towers cannot also split tables by rows; use --tower-sharding table_wise or row_wise")
            L = topology.ranks_per_host
            if dim is None or dim < L:
                raise DistrecError(
                    f"column-wise towers need at least {L} embedding columns (one per rank of a host), got {dim}; "
                    "use --tower-sharding table_wise or a larger model.embedding_dim"
                )
            cuts = [round(dim * l / L) for l in range(L + 1)]
            features = tuple(tuple(int(f) for f in tower) for tower in towers for _ in range(L))
            return cls(topology, features, tuple((cuts[l], cuts[l + 1]) for _ in towers for l in range(L)))
        split = frozenset(int(f) for tower in towers for f in tower) if sharding == "row_wise" else frozenset(int(f) for f in row_wise)
        ranks = []
        for tower in towers:
            whole = np.asarray([f for f in tower if f not in split], dtype=np.int64)
            shared = tuple(int(f) for f in tower if f in split)
            ranks += [tuple(int(f) for f in run) + shared for run in np.array_split(whole, topology.ranks_per_host)]
        return cls(topology, tuple(ranks), row_wise_features=split)

    @property
    def num_features(self) -> int:
        return len(self.exchange_order)

    def widths(self, dim: int) -> list[int]:
        """Floats per sample each rank pools, for embeddings of ``dim`` columns."""
        if self.columns_of_rank is None:
            return [count * dim for count in self.feature_counts]
        return [count * (end - start) for count, (start, end) in zip(self.feature_counts, self.columns_of_rank)]

    def column_index(self, ranks: Sequence[int], dim: int, device: torch.device | None = None) -> torch.Tensor | None:
        """int64 [F_ranks * dim]: the columns that ``ranks``' blocks, side by side, hold of
        each of their features in order; None when they are in order already (table-wise).

        Indexing the side-by-side blocks ``[rows, sum of widths]`` with it gives
        ``[rows, F_ranks * dim]``, features in ``ranks``' order of first appearance (cached).
        """
        if self.columns_of_rank is None:
            return None
        key = (tuple(ranks), dim, torch.device("cpu") if device is None else torch.device(device))
        if key not in self._index_by_device:
            position: dict[tuple[int, int], int] = {}
            offset = 0
            for r in ranks:
                start, end = self.columns_of_rank[r]
                for f in self.features_of_rank[r]:
                    for c in range(start, end):
                        position[(f, c)] = offset
                        offset += 1
            features = list(dict.fromkeys(f for r in ranks for f in self.features_of_rank[r]))
            index = torch.tensor([position[(f, c)] for f in features for c in range(dim)], dtype=torch.int64)
            self._index_by_device[key] = index.to(key[2])
        return self._index_by_device[key]

    def dim(self, pooled_width: int) -> int:
        """D, the embedding columns of a feature, from the width of a rank's pooled tensor."""
        return pooled_width if self.columns_of_rank is None else max(end for _, end in self.columns_of_rank)

    @cached_property
    def feature_counts(self) -> list[int]:
        """Features pooled by each rank."""
        return [len(f) for f in self.features_of_rank]

    def host_features(self, host: int) -> list[int]:
        """The features of ``host``'s tower, in the order its ranks hold them, the row-wise ones last."""
        whole = (f for r in self.topology.host_ranks(host) for f in self.features_of_rank[r] if f not in self.row_wise_features)
        return list(dict.fromkeys(whole)) + self.host_row_wise_features(host)

    def host_row_wise_features(self, host: int) -> list[int]:
        """The row-wise features of ``host``'s tower, the last columns of each of its ranks' pooled tensors."""
        return [f for f in self.features_of_rank[self.topology.rank(host, 0)] if f in self.row_wise_features]

    def host_feature_counts(self) -> list[int]:
        """Features of each host's tower (F_host)."""
        return [len(self.host_features(h)) for h in range(self.topology.hosts)]

    @cached_property
    def exchange_order(self) -> list[int]:
        """Global feature indices in the order the exchanges deliver them (host by host)."""
        return [f for h in range(self.topology.hosts) for f in self.host_features(h)]

    def global_index(self, device: torch.device | None = None) -> torch.Tensor:
        """int64 [F]: position, in the exchange order, of each feature of the global order (cached)."""
        key = torch.device("cpu") if device is None else torch.device(device)
        if key not in self._index_by_device:
            position = torch.empty(self.num_features, dtype=torch.int64)
            position[torch.tensor(self.exchange_order, dtype=torch.int64)] = torch.arange(self.num_features)
            self._index_by_device[key] = position.to(key)
        return self._index_by_device[key]


def local_batch_size(global_rows: int, topology: Topology) -> int:
    """Samples per rank (b) of a global batch of ``global_rows`` samples."""
    if global_rows % topology.world_size != 0:
        raise DistrecError(
            f"global batch of {global_rows} samples does not split evenly over {topology.world_size} ranks; "
            "use a batch size that is a multiple of the world size"
        )
    return global_rows // topology.world_size


def to_peer_order(x: torch.Tensor, topology: Topology) -> torch.Tensor:
    """Step (c): rows of ``x`` in rank-order blocks -> the same blocks in peer order.

    ``x`` has ``world_size x b`` rows, block r holding rank r's samples; the result puts
    block ``rank(h, l)`` at position ``l * hosts + h``, so each local rank's peers' samples
    are contiguous (a copy).
    """
    b = local_batch_size(x.shape[0], topology)
    return x.reshape(topology.hosts, topology.ranks_per_host, b, *x.shape[1:]).transpose(0, 1).reshape(x.shape)


def blocks_to_columns(recv: torch.Tensor, rows: int, widths: Sequence[int]) -> torch.Tensor:
    """(features, peers) -> (peers, features): source-major blocks to one sample-major matrix.

    ``recv`` (1-D) concatenates one ``[rows, widths[i]]`` block per source; the result is
    ``[rows, sum(widths)]`` with the sources' columns side by side, in source order.
    """
    blocks = recv.split([rows * w for w in widths])
    return torch.cat([block.view(rows, w) for block, w in zip(blocks, widths)], dim=1)


def to_global_order(x: torch.Tensor, layout: FeatureLayout) -> torch.Tensor:
    """``[b, F, D]`` in exchange order -> ``[b, F, D]`` in the global feature order."""
    return x.index_select(1, layout.global_index(x.device))


def flat_exchange(pooled: torch.Tensor, layout: FeatureLayout, rank: int, group: Any = None) -> torch.Tensor:
    """The baseline: one all-to-all over all ranks.

    Args:
        pooled: ``[B, F_rank, D]`` this rank's pooled features for all global samples.
        layout: the features each rank pools.
        rank: this rank (global).
        group: the group of all ranks (default: the world).

    Returns:
        ``[b, F, D]`` this rank's samples with every feature, in the global feature order.
    """
    b = _check_input(pooled, layout, rank)
    dim = layout.dim(pooled.shape[2])
    widths = layout.widths(dim)
    send_splits = [b * pooled[0].numel()] * layout.topology.world_size
    recv = differentiable_all_to_all(pooled.reshape(-1), [b * w for w in widths], send_splits, group)
    columns = blocks_to_columns(recv, b, widths)
    if layout.row_wise_features:  # by host: the whole features by rank, then the sum of the row-wise partial sums
        parts, by_host = columns.split(widths, dim=1), []
        for h in range(layout.topology.hosts):
            ranks, shared = layout.topology.host_ranks(h), len(layout.host_row_wise_features(h)) * dim
            by_host += [parts[r][:, : widths[r] - shared] for r in ranks]
            by_host += [torch.stack([parts[r][:, widths[r] - shared :] for r in ranks]).sum(0)] if shared else []
        columns = torch.cat(by_host, dim=1)
    columns = _in_feature_order(columns, layout, range(layout.topology.world_size), dim)
    return to_global_order(columns.view(b, -1, dim), layout)


def sptt_exchange(
    pooled: torch.Tensor,
    layout: FeatureLayout,
    groups: TopologyGroups,
    tower_module: Callable[[torch.Tensor], torch.Tensor] | None = None,
    tower_dims: Sequence[int] | None = None,
    grad_scale: float = 1.0,
    rows_in_peer_order: bool = False,
) -> torch.Tensor:
    """SPTT steps (c)-(f); only the (compressed) tower outputs cross hosts.

    Args:
        pooled: ``[B, F_rank, D]`` this rank's pooled features for all global samples.
        layout: the features each rank pools; host h's ranks hold tower h.
        groups: this rank's groups from ``Topology.build_groups``.
        tower_module: optional map ``[H*b, F_host, D] -> [H*b, out_h]`` applied to this
            host's tower before it crosses hosts (step (e)).
        tower_dims: ``out_h`` of every host's tower module (required with ``tower_module``).
        grad_scale: factor on the gradient returned to ``pooled`` (not on the tower module's).
        rows_in_peer_order: ``pooled``'s rows are in peer order already (``to_peer_order``
            applied), so step (c) is skipped.

    Returns:
        Without a tower module, ``[b, F, D]`` this rank's samples in the global feature order
        (equal to ``flat_exchange``). With one, ``[b, sum(tower_dims)]``: the towers'
        outputs for this rank's samples side by side, by host.
    """
    topology = layout.topology
    b = _check_input(pooled, layout, groups.rank)
    hosts, dim = topology.hosts, layout.dim(pooled.shape[2])
    host = topology.host(groups.rank)
    peer_rows = hosts * b
    # (c) + (d): block l of the peer-ordered rows goes to local rank l
    send = pooled if rows_in_peer_order else to_peer_order(pooled, topology)
    if topology.ranks_per_host == 1:  # both are identities
        tower = _ScaleGrad.apply(send.reshape(peer_rows, -1), grad_scale)
    else:
        tower = _exchange_in_host(send, layout, groups, peer_rows, dim, grad_scale)
    # (e)
    if tower_module is None:
        tower_out, out_widths = tower, [f * dim for f in layout.host_feature_counts()]
    else:
        if tower_dims is None or len(tower_dims) != hosts:
            raise ValueError(f"tower_dims must give the output width of each of the {hosts} towers")
        tower_out, out_widths = tower_module(tower.view(peer_rows, -1, dim)), list(tower_dims)
        if tower_out.shape != (peer_rows, out_widths[host]):
            raise ValueError(f"tower module returned {tuple(tower_out.shape)}, expected ({peer_rows}, {out_widths[host]})")
    # (f): block h of the tower output (the samples of my peer on host h) goes to host h
    if hosts == 1:
        out = tower_out
    else:
        send_splits = [b * out_widths[host]] * hosts
        recv = differentiable_all_to_all(tower_out.reshape(-1), [b * w for w in out_widths], send_splits, groups.cross_host)
        out = blocks_to_columns(recv, b, out_widths)
    return out if tower_module is not None else to_global_order(out.view(b, -1, dim), layout)


def _exchange_in_host(send: torch.Tensor, layout: FeatureLayout, groups: TopologyGroups, peer_rows: int, dim: int, grad_scale: float) -> torch.Tensor:
    """Step (d) on the peer-ordered ``send`` [B, F_rank, D_rank]: an all-to-all of the whole
    (or column-split) features, a reduce-scatter of the row-wise partial sums (the last
    columns, the same features on every rank of the host); returns the host's tower for this
    rank's peers' samples, ``[H*b, F_host * D]`` in ``host_features`` order."""
    topology = layout.topology
    ranks = topology.host_ranks(topology.host(groups.rank))
    shared = len(layout.host_row_wise_features(topology.host(groups.rank)))
    whole = send.shape[1] - shared
    parts = []
    widths = [layout.widths(dim)[r] - shared * dim for r in ranks]
    if any(widths):
        own = send if shared == 0 else send[:, :whole]
        send_splits = [peer_rows * own[0].numel()] * topology.ranks_per_host
        recv = differentiable_all_to_all(own.reshape(-1), [peer_rows * w for w in widths], send_splits, groups.intra_host, grad_scale)
        parts.append(_in_feature_order(blocks_to_columns(recv, peer_rows, widths), layout, ranks, dim))
    if shared:
        partial = send if whole == 0 else send[:, whole:]
        parts.append(differentiable_reduce_scatter(partial.reshape(-1), groups.intra_host, grad_scale).view(peer_rows, -1))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


class _ScaleGrad(torch.autograd.Function):
    """The identity, whose backward multiplies the gradient by ``scale`` (where a skipped
    collective would have scaled it)."""

    @staticmethod
    def forward(ctx, tensor, scale):
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale if ctx.scale != 1.0 else grad, None


def _in_feature_order(columns: torch.Tensor, layout: FeatureLayout, ranks: Sequence[int], dim: int) -> torch.Tensor:
    """``ranks``' blocks side by side -> whole features in order (a no-op when table-wise)."""
    index = layout.column_index(ranks, dim, columns.device)
    return columns if index is None else columns.index_select(1, index)


def _check_input(pooled: torch.Tensor, layout: FeatureLayout, rank: int) -> int:
    """Validate ``pooled`` against the layout; return the local batch size b."""
    expected = layout.feature_counts[rank]
    if pooled.dim() != 3 or pooled.shape[1] != expected:
        raise ValueError(f"rank {rank} expects pooled [B, {expected}, D], got {tuple(pooled.shape)}")
    return local_batch_size(pooled.shape[0], layout.topology)
