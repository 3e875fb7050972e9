"""The parallel-mode interface: how one kind of parallelism turns a model into this rank's.

A *mode* is one way of training the same model: in one process, with sharded or local
tables, with SPTT and DMT's tower modules, with Hotline's tiers or its replicated hot rows.
Models know nothing of ranks (``distrec.models``) and the trainer knows no technique
(``distrec.train``): both meet a mode only through :class:`ParallelMode`. The modes and the
rules that pick one for a config are listed at one composition root, ``distrec.modes``.

On every rank, in this order:

1. ``distrec.modes.select_mode(cfg, world_size)`` picks the mode class, or names the
   incompatibility in one line;
2. ``mode = Mode(ctx)``; the model is built from ``mode.model_tables()`` and
   ``mode.towers()`` (the same model, from the same seed, on every rank);
3. :func:`parallelize` applies the mode in a fixed order (embeddings, device, dense data
   parallelism, training step), as torchtitan's ``parallelize_*`` functions do;
4. every step calls ``Parallelized.step``; ``mode.exchange_stats()`` reports the step's
   all-to-all bytes and times;
5. checkpoints hold ``mode.state_dict()`` with the trainer's own parts beside it
   (``distrec.train.checkpointer``); ``mode.checkpoint_meta()`` describes the layout;
6. ``mode.close()`` releases what outlives a step (worker threads, files).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from distrec.components.breakdown import StepTimer
from distrec.components.exchange import ExchangeStats
from distrec.config import RunConfig
from distrec.data.batch import Batch
from distrec.models.base import RecommendationModel
from distrec.parallel.plan import ShardingPlan
from distrec.tables import TableConfig

EmbeddingLayout = Literal["single", "sharded", "local"]
"""Where a run's tables live, as summaries and checkpoints record it: whole in one process,
sharded over the ranks (by any plan, by tower, with or without hot replicas), or a full copy
per rank."""


@dataclass
class RunContext:
    """What a mode needs to know of the run it parallelises (the same on every rank but ``rank``)."""

    cfg: RunConfig
    tables: list[TableConfig]
    """The real tables, in feature order (the model may be built from stand-ins of them)."""
    num_dense: int
    rank: int
    world_size: int
    device: torch.device
    run_dir: Path
    total_steps: int
    """The run's length in optimizer steps (the default decay length of the schedulers)."""
    timer: StepTimer
    progress: bool
    """Whether this rank shows progress bars."""


class TrainingStep(Protocol):
    """One optimisation step on this rank's part of a global mini-batch."""

    optimizers: list[Optimizer]
    schedulers: list[LRScheduler]

    def __call__(self, batch: Batch, normalizer: float | None = None) -> torch.Tensor:
        """Forward, backward, every optimizer and scheduler; the loss, detached: the mean, or
        the sum over the samples / ``normalizer``."""
        ...


@dataclass
class Parallelized:
    """A model as this rank trains it."""

    module: nn.Module
    """What to call: ``module(batch) -> logits [b]`` (the model, or its data-parallel wrapper)."""
    model: RecommendationModel
    """The model itself, its ``embeddings`` replaced by this rank's."""
    step: TrainingStep


class ParallelMode(ABC):
    """One way of training a model on ``world_size`` processes (see the module doc).

    Subclasses set ``name`` and ``embeddings``, say which configs they train (``accepts``),
    and implement the stages of :func:`parallelize` they change and the checkpoint state.
    """

    name: ClassVar[str]
    """The mode's name, as errors and the docs call it."""
    embeddings: ClassVar[EmbeddingLayout]

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.plan: ShardingPlan | None = None
        self.model: RecommendationModel | None = None
        self.step: TrainingStep | None = None

    # --- selection -----------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def accepts(cls, cfg: RunConfig, world_size: int) -> bool:
        """Whether this mode is the one that trains ``cfg`` on ``world_size`` processes."""

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        """Raise DistrecError (one line) for a setting this mode cannot train with these
        tables; called before any process starts, so it may use no process group."""

    # --- the model -----------------------------------------------------------------------
    def model_tables(self) -> list[TableConfig]:
        """The tables to build the model with: the real ones, or one-row stand-ins where the
        mode makes only this rank's rows itself (from the stand-ins' seed)."""
        return self.ctx.tables

    def towers(self) -> list[list[int]] | None:
        """The feature indices of each tower the model's tower modules need (DMT), or None."""
        return None

    # --- the stages of parallelize, in order ---------------------------------------------
    def shard_embeddings(self, model: RecommendationModel) -> None:
        """Replace ``model.embeddings`` (built on the host) by this rank's embedding module."""

    def wrap_dense(self, model: RecommendationModel) -> nn.Module:
        """The module to call, after the model moved to the device (e.g. DDP over dense layers)."""
        return model

    @abstractmethod
    def make_step(self, model: RecommendationModel, module: nn.Module) -> TrainingStep:
        """The training step of ``module`` (whose unwrapped model is ``model``)."""

    # --- while training ------------------------------------------------------------------
    def exchange_stats(self) -> ExchangeStats | None:
        """Bytes and times of the last forward's embedding all-to-alls (None: no exchange)."""
        return None

    def training_extra(self) -> dict[str, float]:
        """Mode-specific numbers logged beside the training loss (rank 0's; not a collective)."""
        return {}

    def evaluation_extra(self) -> dict[str, float]:
        """Mode-specific metrics beside each evaluation's (a collective)."""
        return {}

    def summary_extra(self) -> dict[str, Any]:
        """Mode-specific entries of the run's summary (rank 0)."""
        return {}

    # --- checkpoints ---------------------------------------------------------------------
    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """This rank's part of a checkpoint: model, optimizers, schedulers, the mode's own state.
        Must load with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists, dicts.
        ``blocks`` lists the table blocks it holds (``distrec.parallel.reshard``)."""

    @abstractmethod
    def load_state_dict(self, own: dict[str, Any], checkpoint: Path, meta: dict[str, Any]) -> None:
        """Continue from a checkpoint: ``own`` is this rank's saved state (or rank 0's when the
        saved run had fewer ranks), ``meta`` the checkpoint's metadata; other ranks' files
        under ``checkpoint`` may be read to reshard."""

    def checkpoint_meta(self) -> dict[str, Any]:
        """The mode's entries of a checkpoint's metadata (the same on every rank)."""
        return {"embeddings": self.embeddings, "plan": self.plan.to_dict() if self.plan is not None else None}

    def write_files(self, directory: Path) -> None:
        """Add files too large for a state dict to a checkpoint directory being written."""

    @classmethod
    @abstractmethod
    def wrote(cls, own: dict[str, Any], meta: dict[str, Any]) -> bool:
        """Whether a checkpoint whose rank 0 saved ``own`` was written by this kind of mode."""

    @classmethod
    def restored_tables(cls, tables: list[TableConfig]) -> list[TableConfig]:
        """The tables to build a one-process model with before ``restore_model`` fills it from
        a checkpoint of this kind of mode (``tables``: the checkpoint's): the real ones, or
        one-row stand-ins where ``restore_model`` brings its own embeddings."""
        return tables

    @classmethod
    @abstractmethod
    def restore_model(cls, model: RecommendationModel, checkpoint: Path, own: dict[str, Any], meta: dict[str, Any]) -> None:
        """Fill a one-process ``model`` (built with ``restored_tables`` of the checkpoint's
        tables) from a checkpoint this kind of mode wrote, gathering every rank's part."""

    def close(self) -> None:
        """Release what outlives a step (worker threads, files)."""


def parallelize(model: RecommendationModel, mode: ParallelMode) -> Parallelized:
    """Apply ``mode`` to ``model`` (built identically on every rank, on the host), in a fixed
    order: this rank's embeddings, the move to its device, dense data parallelism, the step."""
    mode.shard_embeddings(model)
    model.to(mode.ctx.device)
    module = mode.wrap_dense(model)
    step = mode.make_step(model, module)
    mode.model, mode.step = model, step
    mode.ctx.timer.watch_embeddings(model.embeddings, mode.exchange_stats)
    return Parallelized(module, model, step)
