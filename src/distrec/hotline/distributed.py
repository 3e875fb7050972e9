"""DistributedHotlineTraining: Hotline's micro-batch step on every rank of a sharded run.

The model's ``embeddings`` is a :class:`~distrec.hotline.replicated.ReplicatedHotEmbedding`
(hot rows replicated, the rest sharded by the plan) and the dense layers are plain modules
whose gradients ``ReplicatedHotEmbedding.sync_gradients`` averages together with the hot
rows'. Each rank splits its share of a mini-batch into a popular micro-batch, run from the
replicated hot rows without any all-to-all, and a non-popular one, run through the sharded
exchange with only its cold indices (every rank joins that exchange, with no samples if it
has none). As in the one-process pipeline, a worker thread runs the non-popular micro-batch's
exchange and cold lookups (input all-to-all, lookups, output all-to-all) while the popular
micro-batch's forward and backward compute. Both losses are the summed per-sample loss over
the same normaliser, so the gradients, and the trained model, equal the ordinary sharded
trainer's.

The hot set is learned on rank 0 (its access logger samples rank 0's batches) and broadcast
at every re-learning; rows then move between the shards and the hot table with their
row-wise optimizer state, so the choice of hot set changes the traffic, never the maths.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from distrec.components.breakdown import StepTimer
from distrec.components.optim import SparseRowOptimizer
from distrec.components.optimization import Optimization
from distrec.components.step import TrainStep
from distrec.config import RunConfig, embedding_optimizer
from distrec.data.batch import Batch
from distrec.hotline.access_logger import DEFAULT_LOGGER_BYTES, AccessLogger
from distrec.hotline.hot_lookups import find_hot_lookups, split_lookups
from distrec.hotline.hot_set import hot_row_bytes, select_hot_set
from distrec.hotline.pipeline import PipelineStats
from distrec.hotline.replicated import ReplicatedHotEmbedding
from distrec.hotline.row_state import row_state_floats
from distrec.parallel.plan import ShardingPlan
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection
from distrec.tables import TableConfig
from distrec.units import parse_bytes

COLD_EXCHANGE_THREAD = "hotline-cold-exchange"
"""Name (prefix) of the worker thread that runs the non-popular micro-batch's exchange."""


def replicated_hot_embeddings(
    model: nn.Module, tables: list[TableConfig], plan: ShardingPlan, device: torch.device, group: dist.ProcessGroup | None = None
) -> ReplicatedHotEmbedding:
    """The model's tables sharded by ``plan`` behind an (empty) replicated hot table, made
    from the model's own initialisation like ``parallelize_model`` does (``model``'s tables
    may be one-row stand-ins: only their seed and dtype are used)."""
    initializer = model.embeddings.initializer.for_tables(tables)
    dtype = model.embeddings.weight.dtype
    return ReplicatedHotEmbedding(ShardedEmbeddingBagCollection.from_initializer(tables, plan, initializer, group, device, dtype))


class DistributedHotlineTraining:
    """The training step of one rank of a sharded run with replicated hot rows.

    Same contract as ``HotlineTraining`` (``step``, ``stats``, ``state_dict``,
    ``optimizers``, ``schedulers``), for a model whose ``embeddings`` is a
    ReplicatedHotEmbedding and which is not wrapped in DDP.

    Args:
        model: a RecommendationModel whose ``embeddings`` is a ReplicatedHotEmbedding.
        cfg: the run; uses ``cfg.train`` (optimizers, learning rates, schedule, seed) and
            ``cfg.hotline`` (hot budget, sample rate, relearn interval, logger size).
        total_steps: the run's length in optimizer steps (the default decay length; the
            logger samples no mini-batch after the last re-learning before it).
        timer: charges the parts of each step to components (see ``TrainStep``).
        optimization: the optimizers and schedules (default: those of ``cfg.train`` over ``total_steps``).
    """

    def __init__(self, model: nn.Module, cfg: RunConfig, total_steps: int, timer: StepTimer | None = None, optimization: Optimization | None = None) -> None:
        t, h = cfg.train, cfg.hotline
        optimization = optimization or Optimization.of(t, total_steps)
        row_optimizer = embedding_optimizer(cfg)
        self.model = model
        self.embeddings: ReplicatedHotEmbedding = model.embeddings
        self.rank = dist.get_rank(self.embeddings.group)
        self.optimizers = optimization.optimizers(model)
        self.sparse_optimizer = next(o for o in self.optimizers if isinstance(o, SparseRowOptimizer))
        # the shards' rows step in the non-popular micro-batch's backward (the only one that
        # reaches them; nothing reads their gradients), as the sharded trainer's do
        self.sparse_optimizer.update_in_backward(only=self.embeddings.cold.weights)
        self.schedulers = optimization.schedulers(self.optimizers)
        dense = model.dense_parameters()
        self.train_step = TrainStep(model, self.optimizers, self.schedulers, timer=timer, sync_gradients=lambda: self.embeddings.sync_gradients(dense))
        self.row_bytes = hot_row_bytes(self.embeddings.dim, row_state_floats(row_optimizer, self.embeddings.dim), self.embeddings.hot_weight.element_size())
        self.budget_bytes = parse_bytes(h.hot_budget, "hotline.hot_budget")
        logger_bytes = parse_bytes(h.logger_size, "hotline.logger_size") if h.logger_size else DEFAULT_LOGGER_BYTES
        total_rows = self.embeddings.space.total_rows
        self.logger = AccessLogger(logger_bytes, h.sample_rate, seed=t.seed, total_rows=total_rows) if self.rank == 0 else None
        self.relearn_every = h.relearn_every
        self.total_steps = total_steps
        self.counters = PipelineStats()
        self._sampled_at_relearn = 0
        self.all_reduce_bytes = 0  # this rank's gradient all-reduces (dense and hot rows) since training started
        self.timer = timer
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=COLD_EXCHANGE_THREAD)

    def step(self, batch: Batch, normalizer: float | None = None) -> torch.Tensor:
        """One training step on this rank's ``batch`` (a collective); the loss, detached: the
        sum over the samples / ``normalizer`` (default: the batch size)."""
        if self.relearn_every and self.counters.steps and self.counters.steps % self.relearn_every == 0:
            self.relearn()
        size = batch.batch_size
        if self.logger is not None and self._relearns_later():
            self.logger.observe(self.embeddings.space.batch_ids(batch))
        found = find_hot_lookups(batch, self.embeddings.space, self.embeddings.hot_ids)
        self.embeddings.share_touched_rows(found.touched, found.cold_features)
        micro = split_lookups(batch, found)
        num_popular = micro.popular.batch_size
        normalizer = normalizer or size
        try:
            loss = torch.zeros((), device=batch.labels.device)
            if num_popular == 0:
                with self.embeddings.known_rows(micro.other_hot, micro.other_cold):
                    loss += self.train_step.backward(micro.other, normalizer)  # every rank joins the exchange
            else:
                cold = self._worker.submit(self.embeddings.cold_forward, micro.other_cold)  # every rank joins the exchange
                try:
                    with self.embeddings.local_only(), self.embeddings.known_rows(micro.popular_hot):
                        loss += self.train_step.backward(micro.popular, normalizer)
                except BaseException:
                    cold.exception()  # no collective of this step may still run in the worker after it
                    raise
                with self.embeddings.known_rows(micro.other_hot, cold):  # waits for the worker (timed as output_all_to_all)
                    loss += self.train_step.backward(micro.other, normalizer)
        except BaseException:
            self.train_step.zero_grad()
            raise
        self.train_step.apply()
        self.all_reduce_bytes += self.embeddings.reduce_bytes
        if self.timer is not None:
            self.timer.add_bytes("gradient_all_reduce", self.embeddings.reduce_bytes)
        self.counters.record_step(size, num_popular, found.hot)
        return loss

    __call__ = step

    def _relearns_later(self) -> bool:
        """Whether a re-learning after this step will read the logger's window."""
        return bool(self.relearn_every) and (self.counters.steps // self.relearn_every + 1) * self.relearn_every < self.total_steps

    def relearn(self) -> None:
        """Select the hot set from rank 0's logger window, broadcast it and move rows (a
        collective). A window in which rank 0 sampled no mini-batch keeps the current set."""
        device = self.embeddings.hot_ids.device
        count = torch.tensor([-1], device=device)
        ids = None
        if self.logger is not None and self.logger.sampled_batches > self._sampled_at_relearn:
            counted, counts = self.logger.counts()
            hot = select_hot_set(counted, counts, self.embeddings.space, self.row_bytes, self.budget_bytes)
            ids = torch.from_numpy(hot.global_ids(self.embeddings.space)).to(device)
            count[0] = ids.numel()
            self.logger.clear()
        if self.logger is not None:
            self._sampled_at_relearn = self.logger.sampled_batches
        dist.broadcast(count, 0, group=self.embeddings.group)
        if int(count) < 0:
            return
        if ids is None:
            ids = torch.empty(int(count), dtype=torch.int64, device=device)
        dist.broadcast(ids, 0, group=self.embeddings.group)
        self.embeddings.set_hot_ids(ids, self.sparse_optimizer)
        self.counters.relearns += 1

    @contextmanager
    def rows_in_shards(self) -> Iterator[None]:
        """Within the block every row is in its owner's shard (hot rows written back), e.g.
        to save an ordinary sharded checkpoint; the hot table is read back afterwards (collective)."""
        ids = self.embeddings.hot_ids
        self.embeddings.set_hot_ids(ids[:0], self.sparse_optimizer)
        try:
            yield
        finally:
            self.embeddings.set_hot_ids(ids, self.sparse_optimizer)

    def stats(self) -> dict[str, Any]:
        """What Hotline did on this rank so far: popular and hot-lookup fractions, re-learnings,
        the hot rows and their bytes, and the bytes of the gradient all-reduces (dense and hot)."""
        hot_rows = int(self.embeddings.hot_ids.numel())
        return {
            **self.counters.summary(hot_rows, self.budget_bytes),
            "replicated_bytes": hot_rows * self.row_bytes,
            "all_reduce_bytes": self.all_reduce_bytes,
        }

    def state_dict(self) -> dict[str, Any]:
        """The hot set, the counters and, on rank 0, the access logger and its place in the
        learning window (the rows are in the shards' checkpoint blocks), so a resumed run
        re-learns the hot sets the run would have: the same micro-batches, the same sums."""
        logger = {} if self.logger is None else {"logger": self.logger.state_dict(), "sampled_at_relearn": self._sampled_at_relearn}
        return {
            "hot_ids": self.embeddings.hot_ids.cpu(),
            "stats": asdict(self.counters),
            "all_reduce_bytes": self.all_reduce_bytes,
            **logger,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``, after the shards and the optimizers were restored
        (collective). Rank 0's logger starts a new window when the state holds none (a
        checkpoint written before loggers were saved): that changes the hot set, never the maths."""
        self.counters = PipelineStats(**state["stats"])
        self.all_reduce_bytes = int(state["all_reduce_bytes"])
        self.embeddings.set_hot_ids(state["hot_ids"], self.sparse_optimizer)
        if self.logger is None:
            return
        if "logger" in state:
            self.logger.load_state_dict(state["logger"])
            self._sampled_at_relearn = int(state["sampled_at_relearn"])
        else:
            self._sampled_at_relearn = self.logger.sampled_batches

    def close(self) -> None:
        """Stop the worker thread (idle between steps; no files)."""
        self._worker.shutdown()
