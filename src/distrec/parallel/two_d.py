"""TwoD: 2D sparse parallelism, tables sharded within groups of ranks and replicated across them.

Zhang et al., "Two-dimensional Sparse Parallelism for Large Scale Deep Learning
Recommendation Model Training" (arXiv 2508.03854, 2025; TorchRec's ``DMPCollection``): the N
ranks form G replica groups of S = N / G consecutive ranks (so a group spans whole hosts
when S is a multiple of the ranks per host). Each group holds every table, sharded over its
S ranks by a plan for S ranks, and its all-to-all spans only those S ranks; rank s of every
group holds the same shards, and those G ranks form a *replica set* that keeps them
consistent. Dense layers stay data-parallel over all N ranks. Within a group the tables are
placed by a plan (the flat all-to-all) or, with ``--lookup sptt``, by DMT's towers over
the group's hosts and exchanged by SPTT, with or without tower modules: whatever the
placement, :class:`ReplicaGroups` is the one component of this axis, and the placement reads
the ranks to shard over from its ``sharding_env`` (as TorchRec's sharders read
``ShardingEnv2D``). The ranks form a ``DeviceMesh`` of G x S: its ``shard`` dimension gives
the groups, its ``replica`` dimension the replica sets.

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
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from distrec.components.optim import gradient_rows
from distrec.config import RunConfig, embedding_optimizer
from distrec.data.batch import Batch
from distrec.models.base import RecommendationModel
from distrec.models.embedding import RowUpdate, row_update_in_backward, update_rows_in_backward
from distrec.parallel.block_mode import BlockMode
from distrec.parallel.mode import Axis, GradientSync, ParallelMode, RunContext, ShardingEnv, Telemetry, TrainingStep
from distrec.parallel.reshard import held_blocks
from distrec.parallel.sparse_grads import all_gather_rows, average_sparse_grads
from distrec.parallel.spec import ParallelSpec
from distrec.sim.components import ReplicaAverage
from distrec.table_dtype import compute_dtype

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
    member sends its touched rows' change, touch count and states to the others (all-gathers),
    in float32 for half-precision weights.
    """
    counts, rows, origins = touched
    n, width = weights.shape
    flat_states = [s.view(n, -1) for s in states]
    dtype = compute_dtype(weights)  # float32 for half tables
    payload = torch.cat([weights[rows].to(dtype) - origins.to(dtype), counts[rows].unsqueeze(1).to(dtype), *[s[rows].to(dtype) for s in flat_states]], 1)
    weights[rows] = origins
    member_rows, member_values, sent = all_gather_rows(rows, payload, group)
    union, slot = torch.unique(torch.cat(member_rows), return_inverse=True)
    values = torch.cat(member_values)
    summed = values.new_zeros(union.numel(), values.shape[1]).index_add_(0, slot, values)  # change, count, states
    logs = values.new_zeros(union.numel()).index_add_(0, slot, torch.log1p(-values[:, width] / steps))  # -inf for every step
    groups = torch.bincount(slot, minlength=union.numel()).to(values.dtype)  # members that touched each row
    total = summed[:, width]
    reached = steps * (1 - logs.exp())
    weights[union] = (weights[union].to(dtype) + summed[:, :width] * (reached / total).unsqueeze(1)).to(
        weights.dtype
    )  # half tables: rounded to nearest, alike in every replica
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


class ReplicaGroups(Axis):
    """2D sparse parallelism (see the module doc): ``parallel.replica_groups`` G > 1.

    The placement shards its tables within this rank's group (``sharding_env``); this axis
    adds the replica sets and keeps the replicas consistent. Tower modules (DMT) are dense:
    their gradients are averaged over the replica sets every step, whatever ``replica_sync``.
    """

    def __init__(self, ctx: RunContext, spec: ParallelSpec) -> None:
        p = ctx.cfg.parallel
        self.ctx, self.spec = ctx, spec
        self.groups, self.group_size = spec.replica_groups, spec.group_size
        self.group_index = ctx.rank // self.group_size
        self.exact = p.replica_sync == "exact"
        self.sync_every = p.sync_every
        # every rank creates every group, in the same order (torch.distributed's rule)
        shard_groups, _ = replica_layout(ctx.world_size, self.groups)  # the mesh's rows; its columns are the replica sets
        mesh = DeviceMesh(ctx.device.type, torch.tensor(shard_groups), mesh_dim_names=("replica", "shard"))
        self.shard_group = mesh.get_group("shard")
        self.replica_set = mesh.get_group("replica")
        self.sync_bytes = 0  # sent by this rank's replica syncs so far
        self.average = replica_average(ctx.cfg)
        self.touches = TouchLog()
        self.mode: BlockMode | None = None
        self.periodic: PeriodicReplicaSync | None = None
        self._averaged_at = 0  # the periodic step count when the replicas were last averaged
        self._syncs_rows = True  # whether the gradient sync reads row gradients (gradient_sync says)
        self._unwatched: list[nn.Parameter] = []  # with touched merges: the parameters whose rows mark_touched logs

    def after_sharding(self, mode: ParallelMode, model: RecommendationModel) -> None:
        model.register_forward_pre_hook(self._before_evaluation)

    def _before_evaluation(self, module: nn.Module, args: object) -> None:
        """Before a forward that does not train (an evaluation: every rank at once), average the
        replicas a periodic sync left apart, so that every group scores the model a checkpoint
        saves."""
        if not module.training and self.periodic is not None and self._averaged_at != self.periodic.steps:
            self.sync_bytes += self.average_replicas()

    def sharding_env(self, env: ShardingEnv) -> ShardingEnv:
        return ShardingEnv(self.shard_group, self.group_size, self.ctx.rank % self.group_size)

    def _replicated(self, embeddings: nn.Module | None = None) -> list[nn.Parameter]:
        """This rank's table parameters that its replica set holds alike (shards, then replicas),
        in ``embeddings`` (default: the mode's ``block_module()``)."""
        held = held_blocks(self.mode.block_module() if embeddings is None else embeddings)
        return list({id(h.param): h.param for h in held}.values())

    def gradient_sync(self, mode: ParallelMode, model: RecommendationModel, inner: GradientSync | None) -> GradientSync | None:
        assert isinstance(mode, BlockMode), "replica groups hold tables as blocks"
        self.mode = mode
        towers = model.tower_parameters()
        marks = not self.exact and self.average == "touched"
        # only the in-group sync, exact sync and tower averaging read row gradients; a touched
        # merge's log takes the rows of parameters stepped in backward from their updates
        self._syncs_rows = inner is not None or self.exact or bool(towers)
        if not self._syncs_rows and not marks:
            return inner

        def sync() -> None:
            if inner is not None:
                inner.run()
            if marks:
                self.mark_touched()
            if self.exact or towers:
                self._charged(lambda: self.average_grads(towers, self.exact))

        return GradientSync(sync, reads_row_gradients=self._syncs_rows)

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

    def wrap_step(self, step: TrainingStep) -> TrainingStep:
        if self.exact:
            return step
        if self.average == "touched":
            self._unwatched = self.touches.watch_updates(self._replicated(self.mode.model.embeddings))
        self.periodic = PeriodicReplicaSync(step, self.sync_every, lambda: self._charged(self.average_replicas))
        return self.periodic

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
        sparse = self.mode.optimizers()[0]
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
        self._averaged_at = self.periodic.steps if self.periodic is not None else 0
        return sent

    # --- checkpoints ---------------------------------------------------------------------
    def exports_blocks(self) -> bool:
        return self.group_index == 0  # one copy of every table: group 0's

    def before_save(self) -> None:
        if self.periodic is not None and self._averaged_at != self.periodic.steps:  # not averaged since the last step
            self.sync_bytes += self.average_replicas()

    def state_dict(self) -> dict[str, Any]:
        return {"replica_sync_steps": self.periodic.steps} if self.periodic is not None else {}

    def load_state_dict(self, own: dict[str, Any]) -> None:
        if self.periodic is not None:
            self.periodic.steps = int(own.get("replica_sync_steps", 0))

    def meta(self) -> dict[str, Any]:
        return {"replica_groups": self.groups}

    def telemetry(self) -> Telemetry:
        return Telemetry(summary=self._summary)

    def _summary(self) -> dict[str, Any]:
        return {
            "replica_groups": self.groups,
            "replica_sync": "exact" if self.exact else "periodic",
            "replica_sync_bytes": self.sync_bytes,
            **({} if self.exact else {"replica_average": self.average}),
        }
