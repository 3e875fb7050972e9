"""HotlineEmbeddingBagCollection: the models' embedding bags, with weights in two tiers.

Same contract as ``distrec.models.embedding.EmbeddingBagCollection`` (one sum-pooled table
per sparse feature, fused into global row ids; ``Batch -> [B, F, D]``), so it replaces a
model's ``embeddings``. Its weights are not parameters: each forward gathers the rows the
batch needs (deduplicated) from the tier holding each row into a small leaf tensor, pools
it with ``embedding_bag``, and keeps the leaf; after backward, ``TieredRowOptimizer``
applies the summed gradient of every looked-up row to the one tier holding it.

The gather can run ahead in another thread (``lookup``), and the forward pass then uses it
(``prefetched``): that is how the pipeline hides the slow tier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.hotline.hot_set import HotSet, hot_row_bytes
from distrec.hotline.optim import row_state_floats
from distrec.hotline.rows import RowSpace
from distrec.hotline.tiers import RowUpdate, TwoTierStore
from distrec.models.embedding import EmbeddingBagCollection, sample_major_bags, sum_by_row
from distrec.tables import TableConfig


@dataclass
class EmbeddingLookup:
    """The rows one batch needs, gathered before its forward pass.

    Attributes:
        batch: the batch it was gathered for.
        ids: ascending unique global row ids, int64 [U].
        inverse: position in ``ids`` of every index, sample-major, int64 [nnz].
        bag_offsets: bag boundaries of the sample-major indices, int64 [B * F + 1].
        rows: embedding weights of ``ids``, float32 [U, D], on the module's device.
    """

    batch: Batch
    ids: torch.Tensor
    inverse: torch.Tensor
    bag_offsets: torch.Tensor
    rows: torch.Tensor


INT32_MAX = torch.iinfo(torch.int32).max
WeightInit = Callable[[int, int], torch.Tensor]  # (start, end) -> float32 weights [end - start, D]


def uniform_init(tables: list[TableConfig], seed: int) -> WeightInit:
    """DLRM's initialisation, uniform in +-sqrt(1 / num_rows) of each row's table, made chunk
    by chunk (a table need not fit in memory), reproducible from ``seed`` for a given chunking."""
    space = RowSpace.from_tables(tables)
    bounds = torch.tensor([(1.0 / t.num_rows) ** 0.5 for t in tables])
    dim = tables[0].dim

    def init(start: int, end: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + start)
        table, _ = space.to_table_rows(np.arange(start, end))
        return (torch.rand(end - start, dim, generator=gen) * 2 - 1) * bounds[torch.from_numpy(table)].unsqueeze(1)

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
        width = self.dim + row_state_floats(optimizer, self.dim)
        weights = init or uniform_init(self.tables, seed)

        def stored_rows(start: int, end: int) -> torch.Tensor:
            rows = torch.zeros(end - start, width)
            rows[:, : self.dim] = weights(start, end)
            return rows

        self.store = TwoTierStore(self.space.total_rows, width, self.device, stored_rows, slow, directory, progress)
        self._no_offsets = torch.zeros(len(self.tables), dtype=torch.int64, device=self.device)  # ids are global already
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._prefetched: EmbeddingLookup | None = None

    @classmethod
    def from_embedding_bags(cls, ebc: EmbeddingBagCollection, **kwargs: object) -> HotlineEmbeddingBagCollection:
        """A Hotline copy of a models' EmbeddingBagCollection (its weights, zero optimizer state)."""
        weight = ebc.weight.detach()
        return cls(ebc.tables, weight.device, init=lambda start, end: weight[start:end], **kwargs)

    @property
    def num_features(self) -> int:
        return len(self.tables)

    @property
    def hot_row_bytes(self) -> int:
        """Fast-tier bytes of one hot row (weights, optimizer state and id)."""
        return hot_row_bytes(self.dim, self.store.width - self.dim)

    @property
    def hot_ids(self) -> torch.Tensor:
        """Ascending global ids of the rows in the fast tier, on the module's device."""
        return self.store.hot_ids

    def set_hot_set(self, hot: HotSet) -> None:
        """Move rows between tiers so that exactly the rows of ``hot`` are in the fast tier."""
        self.store.set_hot(hot.global_ids(self.space))

    def lookup(self, batch: Batch) -> EmbeddingLookup:
        """Gather the rows ``batch`` needs (may run in a worker thread while no step runs)."""
        global_ids = self.space.batch_ids(batch)  # checks every index against its own table
        indices, bag_offsets = sample_major_bags(global_ids, batch.sparse_offsets, self._no_offsets)
        if self.space.total_rows <= INT32_MAX:  # 32-bit keys sort about twice as fast
            indices = indices.to(torch.int32)
        ids, inverse = torch.unique(indices, return_inverse=True)
        ids = ids.long()
        return EmbeddingLookup(batch, ids, inverse, bag_offsets, self.store.gather(ids, width=self.dim))

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
        weights = lookup.rows.detach().requires_grad_(torch.is_grad_enabled())
        # a sparse gradient (one entry per lookup) skips embedding_bag's sort-based dense backward
        pooled = F.embedding_bag(lookup.inverse, weights, lookup.bag_offsets, mode="sum", include_last_offset=True, sparse=True)
        if weights.requires_grad:
            self._pending.append((lookup.ids, weights))
        return pooled.view(batch.batch_size, self.num_features, self.dim)

    def apply_gradients(self, rule: RowUpdate) -> bool:
        """Update every row looked up since the last call with its summed gradient, in its tier.

        ``rule(rows, grads)`` updates gathered stored rows [n, width] in place. Returns
        whether any row had a gradient.
        """
        parts = [(ids, w.grad) for ids, w in self._pending if w.grad is not None]
        self._pending.clear()
        if not parts:
            return False
        # every entry of the sparse gradients: (global row, gradient of one lookup)
        rows = torch.cat([ids[grad._indices()[0]] for ids, grad in parts])
        values = torch.cat([grad._values() for _, grad in parts])
        ids, grads = sum_by_row(rows, values, self.space.total_rows)
        self.store.update(ids, grads, rule)
        return True

    def clear_gradients(self) -> None:
        """Forget the rows looked up since the last update (their gradients are dropped)."""
        self._pending.clear()

    def weights(self, ids: torch.Tensor) -> torch.Tensor:
        """Current embedding weights of global rows ``ids``: float32 [n, D] on the module's device."""
        return self.store.gather(ids, width=self.dim)

    def close(self) -> None:
        """Release both tiers."""
        self.clear_gradients()
        self.store.close()

    def extra_repr(self) -> str:
        return f"tables={self.num_features}, rows={self.space.total_rows}, dim={self.dim}, hot={self.hot_ids.numel()}, slow={self.store.slow_kind}"
