"""ReplicatedHotEmbedding: hot rows replicated on every rank in front of sharded embeddings.

Distributed Hotline (Adnan et al., ISCA 2024, multi-GPU setting). Every rank holds the same
small table of the hot rows; all other rows stay in the ranks' shards of a
:class:`~distrec.parallel.sharded_embedding.ShardedEmbeddingBagCollection`. A lookup of a
hot row is answered from the local copy and never travels: a popular micro-batch (every
index hot) runs with no embedding all-to-all at all, and a non-popular one sends only its
cold indices through the sharded exchange, which carries only the features with a cold
lookup on some rank in this step (the others' bags would all be empty). Sum pooling is
additive, so a bag's vector is the sum of its hot part and its cold part.

Every row is updated in exactly one place. A hot row's slot in its owner's shard is stale
and never looked up (its indices are filtered out of the exchange); the gradients of the hot
rows some rank looked up are averaged over the ranks in the same all-reduce as the dense
gradients (see ``sync_gradients``), so every replica takes the same step. When the hot set changes,
leaving rows (weights and row-wise optimizer state) are written back into their owners'
shards and entering rows are read out of them (``set_hot_ids``): no update is lost.

Half-precision tables (fp16, bf16: ``distrec.table_dtype``): the hot table is stored in the
shards' dtype, pools into float32 and has a float32 gradient; rows move between it and the
shards unchanged (packed in float32, which holds every half value exactly). Its rounded
writes are keyed alike on every rank (``HOT_ROUNDING_KEY``), so the replicas stay equal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from distrec.allocator import empty_table
from distrec.components.exchange import ExchangeStats
from distrec.data.batch import Batch
from distrec.hotline.hot_lookups import HotBags, find_hot_lookups, hot_bags, keep_indices
from distrec.hotline.rows import RowSpace, find_sorted
from distrec.kernels import compiled, runs_compiled
from distrec.models.embedding import bag_sums
from distrec.parallel.reshard import HeldBlock, held_blocks
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection
from distrec.table_dtype import ROUNDING_KEY, compute_dtype, table_parameter

HOT_ROUNDING_KEY = 1 << 31
"""The hot table's rounding key (``ROUNDING_KEY``): the same on every rank, where its place among
the embedding parameters is not (the ranks hold different shards), and beyond any place."""


class _HotPooling(torch.autograd.Function):
    """Sum pooling of bags of hot-table rows whose backward adds each lookup's bag gradient to
    its row of ``into`` [H, D] and gives the weight no gradient."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor, bag_of: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        ctx.rows, ctx.bag_of, ctx.into = rows, bag_of, into
        return bag_sums(weight, rows, offsets)

    @staticmethod
    @torch.no_grad()
    def backward(ctx, grad: torch.Tensor) -> tuple[None, None, None, None, None]:
        if runs_compiled(ctx.into):
            compiled("hot_lookups").add_picked_rows(ctx.into, ctx.rows, ctx.bag_of, grad.contiguous())
        else:
            ctx.into.index_add_(0, ctx.rows, grad[ctx.bag_of])
        return None, None, None, None, None


class ReplicatedHotEmbedding(nn.Module):
    """Hot rows replicated on every rank, the other rows sharded (``cold``).

    Same contract as the sharded module: ``forward(batch) -> [B_local, F, D]``, a collective
    unless inside ``local_only()`` (for batches whose every index is hot) or given its cold
    part's pooled vectors (``cold_forward``, e.g. run by a worker thread, then ``known_rows``). ``hot_weight``
    [H, D] holds global rows ``hot_ids`` (ascending). The lookups' backward sums the hot rows'
    gradients per row into a buffer (no gradient entry per lookup); ``sync_gradients``
    averages them over the rows any rank looked up (made known by ``share_touched_rows``) and
    makes them ``hot_weight``'s sparse gradient, so the project's sparse optimizers step it
    like any shard.

    Args:
        cold: this rank's sharded embeddings (all rows; hot ones are stale there).

    Example:
        >>> emb = ReplicatedHotEmbedding(ShardedEmbeddingBagCollection.from_full_weights(tables, plan, full))
        >>> emb.set_hot_ids(torch.tensor([3, 17]), sparse_optimizer)   # collective
        >>> with emb.local_only():
        ...     pooled = emb(popular_batch)          # no all-to-all
    """

    def __init__(self, cold: ShardedEmbeddingBagCollection) -> None:
        super().__init__()
        self.cold = cold
        self.tables = cold.tables
        self.dim = cold.dim
        self.space = RowSpace.from_tables(cold.tables)
        self.group = cold.group
        self.world_size = cold.world_size
        weight = next(cold.parameters())
        device = weight.device
        self.hot_ids = torch.zeros(0, dtype=torch.int64, device=device)
        self.hot_weight = table_parameter(torch.zeros(0, self.dim, dtype=weight.dtype, device=device))  # float32 gradients
        setattr(self.hot_weight, ROUNDING_KEY, HOT_ROUNDING_KEY)
        self._hot_grad = torch.zeros(
            0, self.dim, dtype=compute_dtype(weight), device=device
        )  # [H, D] this step's hot-row gradients; zero outside its looked-up rows
        self._offsets = torch.as_tensor(self.space.offsets, device=device)
        self._table_index = {t.name: i for i, t in enumerate(self.tables)}
        self._local_only = False
        self._known: tuple[HotBags, Batch | Future[tuple[torch.Tensor, ExchangeStats]] | None] | None = None
        # this step's bits of touched hot rows, then of features with cold lookups (from the
        # byte given, None: not shared); their pending union
        self._touched: tuple[torch.Tensor, dist.Work, int | None] | None = None
        self.stats = ExchangeStats()  # of the last forward's sharded exchange (zero after a local-only forward)
        self.reduce_bytes = 0  # sent by the last sync_gradients (and its share_touched_rows)

    @contextmanager
    def local_only(self) -> Iterator[None]:
        """Within the block, forward passes read the hot table only (every index must be hot)."""
        self._local_only = True
        try:
            yield
        finally:
            self._local_only = False

    @contextmanager
    def known_rows(self, hot: HotBags, cold: Batch | Future[tuple[torch.Tensor, ExchangeStats]] | None = None) -> Iterator[None]:
        """Within the block, forward passes take their batch's hot lookups ``hot`` as given
        and its cold part from ``cold``: the batch with only its cold indices, exchanged by the
        forward, or the future of its ``cold_forward`` (running elsewhere), waited for; None
        inside ``local_only()``."""
        self._known = (hot, cold)
        try:
            yield
        finally:
            self._known = None

    def cold_forward(self, cold: Batch) -> tuple[torch.Tensor, ExchangeStats]:
        """The cold part of a forward pass (a collective: the sharded exchange of ``cold``, a
        batch with only its cold indices) and its exchange statistics: pooled float32
        [B_local, F, D].

        Thread-safe against a local-only forward of another batch, so a worker thread may
        run it while the caller computes on a popular micro-batch.
        """
        pooled = self.cold(cold, self._cold_features())
        return pooled, self.cold.stats

    def forward(self, batch: Batch) -> torch.Tensor:
        """Pooled embeddings of this rank's samples, float32 [B_local, F, D]."""
        if self._known is None:
            found = find_hot_lookups(batch, self.space, self.hot_ids)
            hot, cold_part = hot_bags(batch, found.hot, found.positions), keep_indices(batch, ~found.hot)
        else:
            hot, cold_part = self._known
        pooled = self._hot_lookups(batch.batch_size, hot)
        if self._local_only:
            self.stats = ExchangeStats()
            return pooled
        if isinstance(cold_part, Batch):
            cold, self.stats = self.cold_forward(cold_part)
            return pooled + cold
        waited = time.perf_counter()
        cold, stats = cold_part.result()
        # the exchange ran beside other work: its bytes count, and as its time only the wait here
        self.stats = ExchangeStats(input_bytes=stats.input_bytes, output_bytes=stats.output_bytes, output_ms=(time.perf_counter() - waited) * 1e3)
        return pooled + cold

    def _hot_lookups(self, batch_size: int, hot: HotBags) -> torch.Tensor:
        """The hot part of ``forward``: each bag's sum of its hot rows, [B_local, F, D] (a view).

        Pooled feature-major by ``embedding_bag`` (the bag kernels are slower on bags of 0 or 1
        rows); the backward adds the lookups' gradients to the buffer that ``sync_gradients`` reads."""
        pooled = _HotPooling.apply(self.hot_weight, hot.rows, hot.offsets, hot.bag_of, self._hot_grad)
        return pooled.view(len(self.tables), batch_size, self.dim).transpose(0, 1)

    # --- gradients --------------------------------------------------------------------------
    def share_touched_rows(self, touched: torch.Tensor, cold_features: torch.Tensor | None = None) -> None:
        """Start the union over the ranks of the hot rows this step looks up and, if given, of
        the features with cold lookups (one collective, asynchronous: ``sync_gradients`` and
        the step's cold exchange wait for it).

        Args:
            touched: uint8 [ceil(H / 8)], one bit per hot row this rank's mini-batch looks up
                (``HotLookups.touched``).
            cold_features: uint8 [ceil(F / 8)], one bit per feature with a cold lookup in this
                rank's mini-batch (``cold_feature_bits``); the cold exchange then carries only
                the features of the union. None: every feature.
        """
        if self._touched is not None:  # the last step stopped before its sync_gradients
            self._hot_grad.zero_()
        packed = touched if cold_features is None else torch.cat([touched, cold_features])
        features_at = None if cold_features is None else touched.numel()
        self._touched = (packed, dist.all_reduce(packed, op=dist.ReduceOp.BOR, group=self.group, async_op=True), features_at)

    def _union(self, start: int, count: int) -> torch.Tensor:
        """Positions int64 (ascending) of the set bits among ``count`` bits from byte ``start``
        of the union ``share_touched_rows`` started (waits for it)."""
        packed, work, _ = self._touched
        work.wait()
        if runs_compiled(packed):
            return compiled("hot_lookups").set_bits(packed[start:], count)
        bits = (packed[start:].unsqueeze(1) >> torch.arange(8, dtype=torch.uint8, device=packed.device)) & 1
        return torch.nonzero(bits.view(-1)[:count]).view(-1)

    def _touched_rows(self) -> torch.Tensor:
        """Positions int64 [T] (ascending) of the hot rows some rank looked up this step."""
        if self._touched is None:
            raise RuntimeError("sync_gradients needs share_touched_rows first in every step")
        rows = self._union(0, self.hot_ids.numel())
        self._touched = None
        return rows

    def _cold_features(self) -> list[int] | None:
        """The features some rank looks up cold rows of in this step (None: not shared, every feature)."""
        features_at = None if self._touched is None else self._touched[2]
        return None if features_at is None else self._union(features_at, len(self.tables)).tolist()

    def sync_gradients(self, dense: list[nn.Parameter]) -> None:
        """Average ``dense`` gradients and the hot table's over the ranks (a collective), then
        make the hot gradient sparse over the rows any rank looked up and average the cold
        module's data-parallel tables.

        One all-reduce of the dense gradients followed by those of the hot rows some rank
        looked up (not the whole hot table; ``share_touched_rows`` named them earlier in the
        step). ``reduce_bytes`` is set to this rank's bytes in it and in the union of the
        touched rows.
        """
        touched_bytes = self._touched[0].numel() if self._touched is not None else 0
        touched = self._touched_rows()
        sizes = [p.numel() for p in dense]
        flat = self._hot_grad.new_empty(sum(sizes) + touched.numel() * self.dim)
        dense_part, rows = flat[: sum(sizes)], flat[sum(sizes) :].view(-1, self.dim)
        if dense:
            torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in dense], out=dense_part)
        # this step's hot-row gradients move into the buffer (this rank's rows are a subset of touched)
        if runs_compiled(flat):
            compiled("hot_lookups").take_and_clear_rows(self._hot_grad, touched, rows)
        else:
            torch.index_select(self._hot_grad, 0, touched, out=rows)
            self._hot_grad.index_fill_(0, touched, 0.0)
        dist.all_reduce(flat, group=self.group)
        flat /= self.world_size
        for p, piece in zip(dense, dense_part.split(sizes)):
            p.grad = piece.view_as(p)
        self.reduce_bytes = flat.numel() * flat.element_size() + touched_bytes
        self.hot_weight.grad = torch.sparse_coo_tensor(touched.unsqueeze(0), rows, self.hot_weight.shape, is_coalesced=True, check_invariants=False)
        if len(self.cold.replicas):
            self.cold.sync_replica_grads()

    # --- moving rows between the hot table and the shards -------------------------------------
    @torch.no_grad()
    def set_hot_ids(self, ids: torch.Tensor, optimizer: Optimizer | None) -> None:
        """Make global rows ``ids`` (ascending, unique; the same on every rank) the hot table.

        A collective. Leaving rows go back to their owners' shards and entering rows come
        out of them, weights and ``optimizer``'s row-wise state (e.g. row-wise Adagrad's
        accumulator) together; rows in both sets keep their hot copy.
        """
        ids = ids.to(self.hot_ids.device, torch.int64)
        stays, old_pos = find_sorted(self.hot_ids, ids)
        leaving = ~find_sorted(ids, self.hot_ids)[0]
        old_rows = self._pack(self.hot_weight.detach(), self._row_state(optimizer, self.hot_weight))
        self._write_rows(self.hot_ids[leaving], old_rows[leaving], optimizer)
        rows = old_rows.new_empty(ids.numel(), old_rows.shape[1])
        rows[stays] = old_rows[old_pos[stays]]
        rows[~stays] = self._read_rows(ids[~stays], old_rows.shape[1], optimizer)
        self.hot_ids = ids
        self.hot_weight.data = empty_table(ids.numel(), self.dim, rows.device, self.hot_weight.dtype).copy_(
            rows[:, : self.dim]
        )  # on huge pages, like the shards
        self.hot_weight.grad = None
        self._hot_grad = empty_table(ids.numel(), self.dim, rows.device, self._hot_grad.dtype).zero_()
        if optimizer is not None:
            state = self._row_state(optimizer, self.hot_weight)
            for k, key in enumerate(state):
                state[key] = rows[:, self.dim + k].contiguous()

    def _pack(self, weights: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """Rows float32 [n, D + state keys]: weights (exactly, whatever their dtype), then one
        column per row-wise state tensor."""
        return torch.cat([weights.float(), *[v.unsqueeze(1) for v in state.values()]], dim=1)

    def _row_state(self, optimizer: Optimizer | None, param: nn.Parameter) -> dict[str, torch.Tensor]:
        """``optimizer``'s state of ``param`` (created empty-handed if no step made it yet);
        every value holds one float per row of ``param``."""
        if optimizer is None:
            return {}
        state = optimizer.state[param]
        if not state:  # the sparse optimizers create their state at the first update
            group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
            no_rows = torch.sparse_coo_tensor(
                torch.zeros(1, 0, dtype=torch.int64, device=param.device),
                param.new_zeros(0, param.shape[1], dtype=compute_dtype(param)),
                param.shape,
                check_invariants=False,
            )
            optimizer.update(param, no_rows, group, state)
        return state

    def _blocks_of(self, ids: torch.Tensor, include_replicas: bool) -> Iterator[tuple[HeldBlock, torch.Tensor, torch.Tensor]]:
        """(block, mask of ``ids`` inside it, their rows in the block's parameter) per held block."""
        table = torch.searchsorted(self._offsets, ids, right=True) - 1
        rows = ids - self._offsets[table]
        for held in held_blocks(self.cold, include_replicas):
            b = held.block
            inside = (table == self._table_index[b.table]) & (rows >= b.row_start) & (rows < b.row_end)
            yield held, inside, rows[inside] - b.row_start + held.base

    def _write_rows(self, ids: torch.Tensor, rows: torch.Tensor, optimizer: Optimizer | None) -> None:
        """Copy packed ``rows`` of global ``ids`` into every block of them this rank holds
        (weights in the block's dtype: exactly, they came from it)."""
        for held, inside, local in self._blocks_of(ids, include_replicas=True):
            b = held.block
            held.param.data[local] = rows[inside, b.col_start : b.col_end].to(held.param.dtype)
            for k, value in enumerate(self._row_state(optimizer, held.param).values()):
                value[local] = rows[inside, self.dim + k]

    def _read_rows(self, ids: torch.Tensor, width: int, optimizer: Optimizer | None) -> torch.Tensor:
        """Packed rows float32 [n, width] of global ``ids`` assembled from their owners (a collective).

        Each (row, column) comes from the one shard holding it (replicated tables from rank
        0); a row-wise state value from the shard holding the row's first column.
        """
        rows = torch.zeros(ids.numel(), width, device=ids.device)
        for held, inside, local in self._blocks_of(ids, include_replicas=dist.get_rank(self.group) == 0):
            b = held.block
            rows[inside, b.col_start : b.col_end] = held.param.data[local].float()
            if b.col_start == 0:
                for k, value in enumerate(self._row_state(optimizer, held.param).values()):
                    rows[inside, self.dim + k] = value[local]
        dist.all_reduce(rows, group=self.group)
        return rows
