"""HotlineEmbeddingBagCollection: the models' embedding bags, with weights in two tiers.

Same contract as ``distrec.models.embedding.EmbeddingBagCollection`` (one sum-pooled table
per sparse feature, fused into global row ids; ``Batch -> [B, F, D]``), so it replaces a
model's ``embeddings``. Its weights are not parameters: each forward pools rows from a leaf
tensor and keeps the leaf; after backward, ``TieredRowOptimizer`` applies the gradient of
every looked-up row to the one tier holding it. The leaf is either

- the fast tier itself (``hot_lookup``, a batch whose rows are all hot): no gather, no
  deduplication, the batch's fast-tier slots index it directly, as ordinary training's
  indices index its table; or
- a small tensor of the batch's distinct rows gathered from both tiers (``lookup``), which
  can run ahead in another thread.

A forward pass uses a staged lookup (``prefetched``) instead of gathering: that is how the
pipeline hides the slow tier.

A half-precision table (fp16, bf16: ``distrec.table_dtype``) is stored so in both tiers
(``RowLayout``; its optimizer state stays float32): lookups pool its rows into float32 sums,
its gradients are float32, and ``TieredRowOptimizer`` rounds updated rows stochastically.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.hotline.hot_set import INDEX_BYTES_PER_ROW, HotSet
from distrec.hotline.row_state import RowLayout
from distrec.hotline.rows import RowSpace
from distrec.hotline.tiers import RowUpdate, TwoTierStore
from distrec.models.embedding import Bags, EmbeddingBagCollection, pool_sum, sample_major
from distrec.models.table_init import TableInit
from distrec.table_dtype import with_float32_gradients
from distrec.tables import TableConfig


@dataclass
class EmbeddingLookup:
    """The rows one batch needs, ready for its forward pass.

    Attributes:
        batch: the batch it was made for.
        ids: global row id of each row of ``rows``, int64 [U].
        slots: fast-tier slot of each row of ``rows`` (-1: slow tier), int64 [U], or None
            when ``rows`` is the fast tier itself (row j = slot j).
        bags: the batch's sample-major bags of positions in ``rows``.
        rows: embedding weights, [U, D] of the table's dtype, on the module's device.
        ready: on CUDA, the event after which ``rows`` are on the device (they were copied on
            the store's own stream); None when they are ready now.
    """

    batch: Batch
    ids: torch.Tensor
    slots: torch.Tensor | None
    bags: Bags
    rows: torch.Tensor
    ready: torch.cuda.Event | None = None


INT32_MAX = torch.iinfo(torch.int32).max
WeightInit = Callable[[int, int], torch.Tensor]  # (start, end) -> weights [end - start, D] (float32, or the table's dtype)


def stacked_rows_init(initializer: TableInit) -> WeightInit:
    """A ``WeightInit`` of the tables stacked in one row space (``RowSpace``), made chunk by
    chunk (a table need not fit in memory) with the values ``initializer`` gives each table,
    so tiers filled from it start where an ordinary model of the same seed does."""
    offsets = RowSpace.from_tables(initializer.tables).offsets.tolist()
    dim = initializer.tables[0].dim

    def init(start: int, end: int) -> torch.Tensor:
        out = torch.empty(end - start, dim)
        for table, (first, stop) in enumerate(zip(offsets[:-1], offsets[1:])):
            lo, hi = max(first, start), min(stop, end)
            if lo < hi:
                initializer.fill(out[lo - start : hi - start], table, lo - first)
        return out

    return init


class HotlineEmbeddingBagCollection(nn.Module):
    """Sum-pooled embedding bags whose rows live in a fast tier (hot) and a slow tier (the rest).

    Args:
        tables: one table per sparse feature, all with the same ``dim``.
        device: the model's device (the fast tier and the outputs live there).
        optimizer: the embedding optimizer (``sgd``, ``adagrad``, ``adam``), whose per-row
            state is stored with each row; step it with ``TieredRowOptimizer``.
        init: the initial weights of global rows ``[start, end)``, called chunk by chunk;
            default DLRM's uniform initialisation from ``seed``. Optimizer state starts at 0.
        slow: the slow tier, ``"disk"``, ``"host"`` or ``"auto"`` (see ``TwoTierStore``).
        directory: where a disk tier's scratch file goes.
        progress: show a progress bar while initialising the slow tier.
        readahead: read a disk tier's pages ahead for each gather (see ``TwoTierStore``).
        slow_file: an existing file of every stored row used as the disk tier in place
            (``TwoTierStore``); ``init`` and ``seed`` are then unused.
        dtype: how the weights are stored, in both tiers: float32, or float16 / bfloat16
            (``RowLayout``; initial weights are rounded to it to nearest, as an ordinary model's).

    Example:
        >>> model.embeddings = HotlineEmbeddingBagCollection(tables, device, optimizer="adagrad")
        >>> model.embeddings.set_hot_set(hot)   # rows of ``hot`` move to the fast tier
        >>> model(batch).shape
        torch.Size([B])
    """

    def __init__(
        self,
        tables: list[TableConfig],
        device: torch.device | str | None = None,
        optimizer: str = "sgd",
        init: WeightInit | None = None,
        seed: int = 0,
        slow: str = "auto",
        directory: str | Path | None = None,
        progress: bool = False,
        readahead: bool = True,
        slow_file: str | Path | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        dims = sorted({t.dim for t in tables})
        if len(dims) != 1:
            raise DistrecError(f"embedding tables have dimensions {dims or 'none'}; give at least one table and every table the same dim")
        self.tables = list(tables)
        self.dim = dims[0]
        self.optimizer = optimizer
        self.space = RowSpace.from_tables(self.tables)
        self.device = torch.device(device if device is not None else "cpu")
        self.layout = RowLayout.of(optimizer, self.dim, dtype)
        weights = init or stacked_rows_init(TableInit(self.tables, seed))

        def stored_rows(start: int, end: int) -> torch.Tensor:
            rows = self.layout.empty(end - start)
            self.layout.weights(rows).copy_(weights(start, end))
            return rows

        self.store = TwoTierStore(
            self.space.total_rows, self.layout.width, self.device, stored_rows, slow, directory, progress, readahead, slow_file, self.layout.unit
        )
        self._no_offsets = torch.zeros(len(self.tables), dtype=torch.int64, device=self.device)  # ids are global already
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._prefetched: EmbeddingLookup | None = None

    @classmethod
    def from_embedding_bags(cls, ebc: EmbeddingBagCollection, **kwargs: object) -> HotlineEmbeddingBagCollection:
        """A Hotline copy of a models' EmbeddingBagCollection (its weights now, in its dtype; zero optimizer state)."""
        weight = ebc.weight.detach()
        hotline = cls(ebc.tables, weight.device, init=lambda start, end: weight[start:end], dtype=weight.dtype, **kwargs)
        hotline.store.initialise()  # copied before the caller changes ``ebc``
        return hotline

    @property
    def num_features(self) -> int:
        return len(self.tables)

    @property
    def hot_row_bytes(self) -> int:
        """Fast-tier bytes of one hot row (weights, optimizer state and id)."""
        return self.layout.row_bytes + INDEX_BYTES_PER_ROW

    @property
    def hot_ids(self) -> torch.Tensor:
        """Ascending global ids of the rows in the fast tier, on the module's device."""
        return self.store.hot_ids

    def set_hot_set(self, hot: HotSet) -> None:
        """Move rows between tiers so that exactly the rows of ``hot`` are in the fast tier."""
        self.store.set_hot(hot.global_ids(self.space))

    def lookup(self, batch: Batch, global_ids: torch.Tensor | None = None) -> EmbeddingLookup:
        """Gather the distinct rows ``batch`` needs from both tiers (may run in a worker thread
        while no step runs); ``global_ids``: ``space.batch_ids(batch)``, if already known."""
        if global_ids is None:
            global_ids = self.space.batch_ids(batch)  # checks every index against its own table
        if self.space.total_rows <= INT32_MAX:  # 32-bit keys sort about twice as fast
            global_ids = global_ids.to(torch.int32)
        ids, inverse = torch.unique(global_ids, return_inverse=True)
        ids = ids.long()
        slots = self.store.slots(ids)
        bags = sample_major(inverse, batch.sparse_offsets, self._no_offsets)
        rows, ready = self.store.gather_staged(ids, width=self.dim, slots=slots)
        return EmbeddingLookup(batch, ids, slots, bags, self.layout.weights(rows), ready)

    def hot_lookup(self, batch: Batch, slots: torch.Tensor) -> EmbeddingLookup:
        """A lookup of ``batch`` straight from the fast tier; ``slots``: the fast-tier slot of
        every index of ``batch.sparse_values`` (all hot), int64 [nnz]."""
        bags = sample_major(slots, batch.sparse_offsets, self._no_offsets)
        return EmbeddingLookup(batch, self.store.hot_ids, None, bags, self.layout.weights(self.store.fast))

    @contextmanager
    def prefetched(self, lookup: EmbeddingLookup) -> Iterator[None]:
        """Within the block, a forward pass of ``lookup.batch`` uses ``lookup`` instead of gathering."""
        self._prefetched = lookup
        try:
            yield
        finally:
            self._prefetched = None

    def forward(self, batch: Batch) -> torch.Tensor:
        """Pooled embeddings of every feature: float32 [B, F, D]."""
        staged = self._prefetched
        lookup = staged if staged is not None and staged.batch is batch else self.lookup(batch)
        if lookup.ready is not None:  # the rows came on the store's copy stream: this stream waits for them, the host does not
            stream = torch.cuda.current_stream(lookup.rows.device)
            stream.wait_event(lookup.ready)
            lookup.rows.record_stream(stream)
        weights = lookup.rows.detach().requires_grad_(torch.is_grad_enabled())
        if weights.requires_grad:
            with_float32_gradients(weights)  # as a half table's parameter
        pooled = pool_sum(weights, lookup.bags)
        if weights.requires_grad:
            self._pending.append((lookup, weights))
        return pooled.view(batch.batch_size, self.num_features, self.dim)

    def apply_gradients(self, rule: RowUpdate) -> bool:
        """Update every row looked up since the last call with its summed gradient, in its tier.

        ``rule(rows, grad)`` updates stored rows [n, width] (``layout``) in place from a sparse
        float32 [n, dim] gradient (see ``RowUpdate``). Returns whether any row had a gradient.
        """
        parts = [(lookup, w.grad) for lookup, w in self._pending if w.grad is not None]
        self._pending.clear()
        if not parts:
            return False
        slots, slot_grads, cold_ids, cold_grads = [], [], [], []
        for lookup, grad in parts:
            rows, values = grad._indices()[0], grad._values()
            if lookup.slots is None:  # rows are fast-tier slots already
                slots.append(rows)
                slot_grads.append(values)
                continue
            entry_slots = lookup.slots[rows]
            hot = entry_slots >= 0
            slots.append(entry_slots[hot])
            slot_grads.append(values[hot])
            cold_ids.append(lookup.ids[rows[~hot]])
            cold_grads.append(values[~hot])
        empty_ids, empty_grads = slots[0][:0], slot_grads[0][:0]
        self.store.update(torch.cat(slots), torch.cat(slot_grads), torch.cat(cold_ids or [empty_ids]), torch.cat(cold_grads or [empty_grads]), rule)
        return True

    def clear_gradients(self) -> None:
        """Forget the rows looked up since the last update (their gradients are dropped)."""
        self._pending.clear()

    def weights(self, ids: torch.Tensor) -> torch.Tensor:
        """Current embedding weights of global rows ``ids``: [n, D] of the table's dtype, on the module's device."""
        return self.layout.weights(self.store.gather(ids, width=self.dim))

    def close(self) -> None:
        """Release both tiers."""
        self.clear_gradients()
        self.store.close()

    def extra_repr(self) -> str:
        stored = "" if self.layout.dtype == torch.float32 else f", dtype={self.layout.dtype}"
        return f"tables={self.num_features}, rows={self.space.total_rows}, dim={self.dim}{stored}, hot={self.hot_ids.numel()}, slow={self.store.slow_kind}"
