"""TwoD: 2D sparse parallelism, tables sharded within groups of ranks and replicated across them.

Zhang et al., "Two-dimensional Sparse Parallelism for Large Scale Deep Learning
Recommendation Model Training" (arXiv 2508.03854, 2025; TorchRec's ``DMPCollection``): the N
ranks form G replica groups of S = N / G consecutive ranks (so a group spans whole hosts
when S is a multiple of the ranks per host). Each group holds every table, sharded over its
S ranks by a plan for S ranks, and its all-to-all spans only those S ranks; rank s of every
group holds the same shards, and those G ranks form a *replica set* that keeps them
consistent. Dense layers stay data-parallel over all N ranks. Within a group the tables are
placed by a plan (``TwoD``, the flat all-to-all) or, with ``--lookup sptt``, by DMT's towers
over the group's hosts and exchanged by SPTT, with or without tower modules (``TwoDSptt``,
``TwoDSpttTowers``).

Keeping the replicas consistent (``parallel.replica_sync``):

- ``exact``: after backward, each replica set averages its shards' sparse row gradients
  (only the rows touched in some group travel), so every group applies the same update and
  training equals one process's;
- ``periodic``: each group updates its replica alone, and every ``parallel.sync_every``
  steps each replica set averages its weights and row-wise optimizer state (as
  ``DMPCollection`` does); with ``sync_every`` 1 it equals ``exact`` for SGD.
  ``parallel.replica_average`` says how a row is merged: the mean over ``all`` groups
  (``DMPCollection``'s), or from the groups that ``touched`` it since the last sync
  (``merge_touched_rows``). Adagrad's and Adam's steps hardly depend on the gradient's
  scale, so a row one group of G touched moves by about one step there and by 1/G step in
  the mean over all groups, where one run would move it by about one step; ``touched``
  sums the groups' changes and scales them to the number of steps one run would have
  updated the row (``auto``: ``touched`` for those optimizers, ``all`` for SGD, whose mean
  equals ``exact`` at ``sync_every`` 1).

Checkpoints hold one copy of every table: group 0's blocks (a periodic run averages the
replicas first, so resume exactly from checkpoints at multiples of ``sync_every``); they
load into any other layout, and any checkpoint loads into this one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from distrec.components.optim import gradient_rows
from distrec.config import RunConfig, embedding_optimizer
from distrec.data.batch import Batch
from distrec.models.base import RecommendationModel
from distrec.models.embedding import RowUpdate, row_update_in_backward, update_rows_in_backward
from distrec.parallel.block_mode import BlockMode
from distrec.parallel.mode import RunContext, TrainingStep
from distrec.parallel.parallelize import resolve_plan
from distrec.parallel.reshard import held_blocks
from distrec.parallel.sharded import Sharded
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection
from distrec.parallel.sparse_grads import all_gather_rows, average_sparse_grads
from distrec.parallel.sptt_mode import Sptt, SpttTowers
from distrec.sim.components import ReplicaAverage
from distrec.tables import TableConfig

SCALE_FREE_OPTIMIZERS = ("adagrad", "adam")
"""Embedding optimizers whose row step is about the same for a gradient and its multiples."""


def replica_layout(world_size: int, groups: int) -> tuple[list[list[int]], list[list[int]]]:
    """The ranks of each replica group (consecutive) and of each replica set (rank s of every group)."""
    size = world_size // groups
    shard_groups = [list(range(g * size, (g + 1) * size)) for g in range(groups)]
    replica_sets = [[g * size + s for g in range(groups)] for s in range(size)]
    return shard_groups, replica_sets


def replica_average(cfg: RunConfig) -> ReplicaAverage:
    """Over which groups a ``periodic`` sync averages a row: ``parallel.replica_average``, with
    ``auto`` resolved by the embedding optimizer (see the module doc)."""
    chosen = cfg.parallel.replica_average
    if chosen == "auto":
        return "touched" if embedding_optimizer(cfg) in SCALE_FREE_OPTIMIZERS else "all"
    return "touched" if chosen == "touched" else "all"


class TouchLog:
    """What each table parameter of this rank went through since the last periodic sync:
    how many steps touched each row (float [rows]) and, for every touched row, its weights
    before the first of those steps (where all replicas agreed).

    Rows are logged from each step's gradients (``record`` before the optimizer step), or, for
    parameters the optimizer steps in backward, as they are stepped (``watch_updates``)."""

    def __init__(self) -> None:
        self.steps = 0
        self.counts: dict[nn.Parameter, torch.Tensor] = {}
        self.origins: dict[nn.Parameter, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    @torch.no_grad()
    def record(self, param: nn.Parameter, rows: torch.Tensor) -> None:
        """Count a step touching the distinct ``rows`` (int64) of ``param``; call it before the update."""
        counts = self.counts.setdefault(param, param.new_zeros(param.shape[0]))
        fresh = rows[counts[rows] == 0]
        if fresh.numel():
            self.origins.setdefault(param, []).append((fresh, param.data[fresh].clone()))
        counts[rows] += 1

    def watch_updates(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """Have every one of ``params`` that is stepped in backward (``update_rows_in_backward``)
        ``record`` its rows just before each update; the others, whose rows the caller records."""
        unwatched = []
        for p in params:
            update = row_update_in_backward(p)
            if update is None:
                unwatched.append(p)
            else:
                update_rows_in_backward(p, functools.partial(self._record_then_update, p, update))
        return unwatched

    def _record_then_update(self, param: nn.Parameter, update: RowUpdate, rows: torch.Tensor, *entries: torch.Tensor) -> None:
        self.record(param, rows)
        update(rows, *entries)

    def take(self, param: nn.Parameter) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``param``'s touch counts [rows], touched rows [n] and their weights at the last sync
        [n, D], forgetting them (a sync follows)."""
        parts = self.origins.pop(param, [])
        rows = torch.cat([r for r, _ in parts]) if parts else torch.empty(0, dtype=torch.int64, device=param.device)
        origins = torch.cat([o for _, o in parts]) if parts else param.new_empty(0, param.shape[1])
        return self.counts.pop(param, param.new_zeros(param.shape[0])), rows, origins


@torch.no_grad()
def merge_touched_rows(
    weights: torch.Tensor, states: list[torch.Tensor], touched: tuple[torch.Tensor, torch.Tensor, torch.Tensor], steps: int, group: dist.ProcessGroup | None
) -> int:
    """Merge the replicas of one table over ``group`` (a collective), row by row from the
    groups that touched the row since the last sync, ``steps`` steps ago; the bytes this rank sent.

    ``weights`` [rows, D] become their value at the last sync plus the sum of every group's
    change, scaled to the number of steps a single run would have updated the row: that
    number is estimated as if each group touched the row at random steps (``steps`` times
    1 - prod(1 - n_g / steps) for a group touching it in n_g steps), divided by the sum of
    the n_g. At ``steps`` 1 that is the mean change of the groups that touched the row; a
    row one group touched at a few of many steps keeps all of that group's change. The
    optimizer's row ``states`` ([rows] or [rows, W]) become their mean over the groups that
    touched the row. ``touched`` is ``TouchLog.take``'s.

    Only touched rows travel (a row no group touched is the same in every replica): each
    member sends its touched rows' change, touch count and states to the others (all-gathers).
    """
    counts, rows, origins = touched
    n, width = weights.shape
    flat_states = [s.view(n, -1) for s in states]
    payload = torch.cat([weights[rows] - origins, counts[rows].unsqueeze(1), *[s[rows].to(weights.dtype) for s in flat_states]], 1)
    weights[rows] = origins
    member_rows, member_values, sent = all_gather_rows(rows, payload, group)
    union, slot = torch.unique(torch.cat(member_rows), return_inverse=True)
    values = torch.cat(member_values)
    summed = values.new_zeros(union.numel(), values.shape[1]).index_add_(0, slot, values)  # change, count, states
    logs = values.new_zeros(union.numel()).index_add_(0, slot, torch.log1p(-values[:, width] / steps))  # -inf for every step
    groups = torch.bincount(slot, minlength=union.numel()).to(values.dtype)  # members that touched each row
    total = summed[:, width]
    reached = steps * (1 - logs.exp())
    weights[union] += summed[:, :width] * (reached / total).unsqueeze(1)
    offset = width + 1
    for state in flat_states:
        state[union] = (summed[:, offset : offset + state.shape[1]] / groups.unsqueeze(1)).to(state.dtype)
        offset += state.shape[1]
    return sent


class PeriodicReplicaSync:
    """A training step that averages the replicas every ``every`` steps (``periodic`` sync)."""

    def __init__(self, step: TrainingStep, every: int, average: Callable[[], object]) -> None:
        self.step, self.every, self.average = step, every, average
        self.optimizers, self.schedulers = step.optimizers, step.schedulers
        self.steps = 0

    def __call__(self, batch: Batch, normalizer: float | None = None) -> torch.Tensor:
        loss = self.step(batch, normalizer)
        self.steps += 1
        if self.steps % self.every == 0:
            self.average()
        return loss


class ReplicaGroups(BlockMode):
    """2D sparse parallelism over a mode that shards the tables within one replica group
    (see the module doc): ``parallel.replica_groups`` G > 1.

    Put before that mode in the bases (``class TwoD(ReplicaGroups, Sharded)``): the mode
    builds this rank's group's embedding module in ``shard_within_group``; this class adds
    the replica sets and keeps the replicas consistent. Tower modules (DMT) are dense: their
    gradients are averaged over the replica sets every step, whatever ``replica_sync``.
    """

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        p = ctx.cfg.parallel
        self.groups, self.group_size = p.replica_groups, ctx.world_size // p.replica_groups
        self.group_index = ctx.rank // self.group_size
        self.replica_set: dist.ProcessGroup | None = None
        self.sync_bytes = 0  # sent by this rank's replica syncs so far
        self.average = replica_average(ctx.cfg)
        self.touches = TouchLog()
        self._syncs_rows = True  # whether the gradient sync reads row gradients (gradient_sync says)
        self._unwatched: list[nn.Parameter] = []  # with touched merges: the parameters whose rows mark_touched logs

    @classmethod
    def accepts(cls, cfg: RunConfig, world_size: int) -> bool:
        return cfg.parallel.replica_groups > 1 and super().accepts(cfg, world_size)

    def shard_embeddings(self, model: RecommendationModel) -> None:
        self.shard_within_group(model)
        # every rank creates every group, in the same order (torch.distributed's rule)
        _, replica_sets = replica_layout(self.ctx.world_size, self.groups)
        self.replica_set = [dist.new_group(ranks) for ranks in replica_sets][self.ctx.rank % self.group_size]

    def shard_within_group(self, model: RecommendationModel) -> None:
        """Replace ``model.embeddings`` by this rank's share of its replica group's tables."""
        super().shard_embeddings(model)

    def _replicated(self, embeddings: nn.Module | None = None) -> list[nn.Parameter]:
        """This rank's table parameters that its replica set holds alike (shards, then replicas),
        in ``embeddings`` (default: ``block_module()``)."""
        held = held_blocks(self.block_module() if embeddings is None else embeddings)
        return list({id(h.param): h.param for h in held}.values())

    def gradient_sync(self, model: RecommendationModel) -> Callable[[], None] | None:
        in_group = super().gradient_sync(model)
        exact = self.ctx.cfg.parallel.replica_sync == "exact"
        towers = model.tower_parameters()
        marks = not exact and self.average == "touched"
        self._syncs_rows = in_group is not None or exact or bool(towers)
        if not self._syncs_rows and not marks:
            return in_group

        def sync() -> None:
            if in_group is not None:
                in_group()
            if marks:
                self.mark_touched()
            if exact or towers:
                self._charged(lambda: self.average_grads(towers, exact))

        return sync

    def reads_row_gradients(self, sync: Callable[[], None] | None) -> bool:
        """Only the in-group sync, exact sync and tower averaging do; a touched merge's log takes
        the rows of parameters stepped in backward from their updates (``TouchLog.watch_updates``)."""
        return self._syncs_rows

    def mark_touched(self) -> None:
        """Count a step for the next periodic sync, and log the rows this step's gradients touch
        (all rows of a dense gradient) for the parameters not stepped in backward."""
        self.touches.steps += 1
        for p in self._unwatched:
            if p.grad is not None:
                rows = gradient_rows(p.grad)[0].unique() if p.grad.is_sparse else torch.arange(p.shape[0], device=p.device)
                self.touches.record(p, rows)

    def average_grads(self, towers: list[nn.Parameter], rows: bool) -> int:
        """Average every replica set's tower-module gradients and, when ``rows``, its sparse row
        gradients (a collective); the bytes this rank sent."""
        sent = 0
        for p in towers:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.replica_set)
                p.grad /= self.groups
                sent += p.grad.numel() * p.grad.element_size()
        if rows:
            sent += average_sparse_grads(self._replicated(), self.replica_set)
        return sent

    def make_step(self, model: RecommendationModel, module: nn.Module) -> TrainingStep:
        step = super().make_step(model, module)
        if self.ctx.cfg.parallel.replica_sync == "exact":
            return step
        if self.average == "touched":
            self._unwatched = self.touches.watch_updates(self._replicated(model.embeddings))
        return PeriodicReplicaSync(step, self.ctx.cfg.parallel.sync_every, lambda: self._charged(self.average_replicas))

    def _charged(self, sync: Callable[[], int]) -> None:
        """Run a replica sync of a training step, its time and bytes charged to the breakdown's ``replica_sync``."""
        with self.ctx.timer.phase("replica_sync"):
            sent = sync()
        self.ctx.timer.add_bytes("replica_sync", sent)
        self.sync_bytes += sent

    @torch.no_grad()
    def average_replicas(self) -> int:
        """Average every replica set's table weights and row-wise optimizer state over all groups
        or, with ``touched`` averaging, row by row over the groups that updated the row (a
        collective); the bytes this rank sent."""
        sparse = self._optimizers()[0]
        sent = 0
        for p in self._replicated():
            state = sparse.state.get(p, {}) if sparse is not None else {}
            tensors = [p.data, *(state[k] for k in sorted(state) if torch.is_tensor(state[k]) and state[k].dim() > 0)]
            if self.average == "touched":
                sent += merge_touched_rows(p.data, tensors[1:], self.touches.take(p), max(self.touches.steps, 1), self.replica_set)
                continue
            for tensor in tensors:
                dist.all_reduce(tensor, group=self.replica_set)
                tensor /= self.groups
                sent += tensor.numel() * tensor.element_size()
        self.touches.steps = 0
        return sent

    # --- checkpoints ---------------------------------------------------------------------
    def export_table_blocks(self, sparse: Optimizer | None) -> list[dict[str, Any]]:
        if self.group_index != 0:
            return []  # one copy of every table: group 0's
        return super().export_table_blocks(sparse)

    def state_dict(self) -> dict[str, Any]:
        if isinstance(self.step, PeriodicReplicaSync):
            self.sync_bytes += self.average_replicas()
        state = super().state_dict()
        if isinstance(self.step, PeriodicReplicaSync):
            state["replica_sync_steps"] = self.step.steps
        return state

    def load_state_dict(self, own: dict[str, Any], checkpoint: Path, meta: dict[str, Any]) -> None:
        super().load_state_dict(own, checkpoint, meta)
        if isinstance(self.step, PeriodicReplicaSync):
            self.step.steps = int(own.get("replica_sync_steps", 0))

    def checkpoint_meta(self) -> dict[str, Any]:
        return {**super().checkpoint_meta(), "replica_groups": self.groups}

    def summary_extra(self) -> dict[str, Any]:
        return {
            **super().summary_extra(),
            "replica_groups": self.groups,
            "replica_sync": self.ctx.cfg.parallel.replica_sync,
            "replica_sync_bytes": self.sync_bytes,
            **({"replica_average": self.average} if self.ctx.cfg.parallel.replica_sync == "periodic" else {}),
        }


class TwoD(ReplicaGroups, Sharded):
    """2D sparse parallelism with a plan for S = N / G ranks within each group (the flat all-to-all)."""

    name = "2d"

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        resolve_plan(tables, cfg.parallel, world_size // cfg.parallel.replica_groups)

    def shard_within_group(self, model: RecommendationModel) -> None:
        shard_groups, _ = replica_layout(self.ctx.world_size, self.groups)
        shard_group = [dist.new_group(ranks) for ranks in shard_groups][self.group_index]
        tables = self.ctx.tables
        self.plan = resolve_plan(tables, self.ctx.cfg.parallel, self.group_size)
        initializer = model.embeddings.initializer.for_tables(tables)
        model.embeddings = ShardedEmbeddingBagCollection.from_initializer(tables, self.plan, initializer, shard_group, self.ctx.device)


class TwoDSptt(ReplicaGroups, Sptt):
    """2D sparse parallelism with DMT's SPTT inside each group of ``hosts / G`` hosts."""

    name = "2d-sptt"


class TwoDSpttTowers(ReplicaGroups, SpttTowers):
    """2D sparse parallelism with DMT's SPTT and tower modules inside each group of ``hosts / G`` hosts."""

    name = "2d-sptt-towers"
