"""The parallel-mode interface: how one placement of the tables turns a model into this rank's.

A *mode* is one value of the placement axis of a :class:`~distrec.parallel.spec.ParallelSpec`:
tables whole in one process, sharded, by tower with SPTT, local, or in Hotline's tiers. The
other axes (replica groups, ...) are :class:`Axis` components that a mode applies at fixed
points (``distrec.parallel.block_mode``); no mode derives from another axis. Models know
nothing of ranks (``distrec.models``) and the trainer knows no technique (``distrec.train``):
both meet a mode only through :class:`ParallelMode`, built by ``distrec.modes.build_mode``.

On every rank, in this order:

1. ``distrec.modes.build_mode(ctx)`` reads the spec and builds the mode with its axes;
2. the model is built from ``mode.model_layout()`` (the same model, from the same seed, on
   every rank);
3. :func:`parallelize` applies the mode in a fixed order (embeddings, device, dense data
   parallelism, training step from the trainer's ``Optimization``), as torchtitan's
   ``parallelize_*`` functions do;
4. the trainer attaches ``mode.telemetry()`` (exchange bytes and times, extra metrics);
5. checkpoints hold ``mode.checkpoint_format()``'s state beside the trainer's own parts
   (``distrec.train.checkpointer``); the format's tag is written in ``meta.json``;
6. ``mode.close()`` releases what outlives a step (worker threads, files).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from distrec.components.breakdown import StepTimer
from distrec.components.exchange import ExchangeStats
from distrec.components.optimization import Optimization
from distrec.components.step import TrainStep
from distrec.config import RunConfig
from distrec.data.batch import Batch
from distrec.models.base import RecommendationModel
from distrec.parallel.plan import ShardingPlan
from distrec.parallel.spec import ParallelSpec
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
    """The run's length in optimizer steps."""
    timer: StepTimer
    show_progress: bool
    """Whether this rank shows progress bars."""


@dataclass(frozen=True)
class ShardingEnv:
    """The ranks a mode shards its tables over: all of them, or this rank's replica group (2D),
    as TorchRec's ``ShardingEnv2D`` tells its sharders."""

    group: dist.ProcessGroup | None
    """The process group of those ranks (None: the default group)."""
    size: int
    rank: int
    """This rank's index among them."""


@dataclass(frozen=True)
class ModelLayout:
    """What to build the model with: the tables (real ones, or one-row stand-ins where the
    mode makes only this rank's rows itself, from the stand-ins' seed) and DMT's towers."""

    tables: list[TableConfig]
    towers: list[list[int]] | None = None
    """Feature indices of each tower for the tower modules, or None."""


class TrainingStep(Protocol):
    """One optimisation step on this rank's part of a global mini-batch."""

    optimizers: list[Optimizer]
    schedulers: list[LRScheduler]

    def __call__(self, batch: Batch, normalizer: float | None = None) -> torch.Tensor:
        """Forward, backward, every optimizer and scheduler; the loss, detached: the mean, or
        the sum over the samples / ``normalizer``."""
        ...


@dataclass
class GradientSync:
    """What runs between backward and the optimizers (e.g. all-reduce replicated rows)."""

    run: Callable[[], None]
    reads_row_gradients: bool = True
    """Whether ``run`` reads the embedding rows' gradients, which must then be made (the rows
    are not stepped in backward)."""


@dataclass
class Telemetry:
    """What a mode or axis reports while training; each hook optional (None: nothing)."""

    exchange: Callable[[], ExchangeStats | None] | None = None
    """Bytes and times of the last forward's embedding all-to-alls."""
    training: Callable[[], dict[str, float]] | None = None
    """Numbers logged beside the training loss (rank 0's; not a collective)."""
    evaluation: Callable[[], dict[str, float]] | None = None
    """Metrics beside each evaluation's (a collective)."""
    summary: Callable[[], dict[str, Any]] | None = None
    """Entries of the run's summary (rank 0)."""


def merged(parts: list[Telemetry]) -> Telemetry:
    """One Telemetry whose every hook is set: the first part's exchange statistics, and the
    other hooks' entries of all parts, merged in order."""

    def combine(hook: str) -> Callable[[], dict[str, Any]]:
        return lambda: {k: v for part in parts if (read := getattr(part, hook)) is not None for k, v in read().items()}

    exchanges = [part.exchange for part in parts if part.exchange is not None]
    return Telemetry(exchanges[0] if exchanges else lambda: None, combine("training"), combine("evaluation"), combine("summary"))


class CheckpointFormat(ABC):
    """How a mode's state is laid out in a checkpoint: a part the checkpointer saves beside
    the trainer's (``state_dict`` / ``load_state_dict``), metadata, large files, and how a
    one-process model is filled from it for evaluation. ``tag`` is written into ``meta.json``
    (``format``), so loading never guesses which format wrote a checkpoint."""

    tag: ClassVar[str]

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """This rank's state. Must load with ``torch.load(weights_only=True)``: tensors,
        numbers, strings, lists, dicts. ``blocks`` lists the table blocks it holds."""

    @abstractmethod
    def load_state_dict(self, own: dict[str, Any], checkpoint: Path, meta: dict[str, Any]) -> None:
        """Continue from a checkpoint: ``own`` is this rank's saved state (or rank 0's when the
        saved run had fewer ranks); other ranks' files under ``checkpoint`` may be read."""

    def meta(self) -> dict[str, Any]:
        """The format's entries of the checkpoint's metadata (the same on every rank)."""
        return {}

    def write_files(self, directory: Path) -> None:
        """Add files too large for a state dict to a checkpoint directory being written."""

    def files_bytes(self) -> int:
        """Bytes ``write_files`` writes at most (what a full disk's message says a save needs)."""
        return 0

    @classmethod
    def restored_tables(cls, tables: list[TableConfig]) -> list[TableConfig]:
        """The tables to build a one-process model with before ``restore_model`` (``tables``:
        the checkpoint's): the real ones, or stand-ins where ``restore_model`` brings its own."""
        return tables

    @classmethod
    @abstractmethod
    def restore_model(cls, model: RecommendationModel, checkpoint: Path, own: dict[str, Any], meta: dict[str, Any]) -> None:
        """Fill a one-process ``model`` (built with ``restored_tables``) from a checkpoint of
        this format, gathering every rank's part."""


class Axis:
    """One value of a parallel axis other than the placement (e.g. replica groups), applied by
    the modes that support it at fixed points; every hook's default changes nothing."""

    def sharding_env(self, env: ShardingEnv) -> ShardingEnv:
        """The ranks to shard the tables over, given those the previous axes left."""
        return env

    def after_sharding(self, mode: ParallelMode, model: RecommendationModel) -> None:
        """Called once the mode built ``model``'s embeddings (e.g. to hook the model's forward)."""

    def gradient_sync(self, mode: ParallelMode, model: RecommendationModel, inner: GradientSync | None) -> GradientSync | None:
        """The gradient sync with this axis' part added to the mode's (``inner``)."""
        return inner

    def wrap_step(self, step: TrainingStep) -> TrainingStep:
        """The training step with this axis' work added."""
        return step

    def exports_blocks(self) -> bool:
        """Whether this rank writes its table blocks into checkpoints (one copy of each)."""
        return True

    def before_save(self) -> None:
        """Called before the state is taken for a checkpoint (a collective)."""

    def state_dict(self) -> dict[str, Any]:
        """This axis' entries of the rank's checkpoint state."""
        return {}

    def load_state_dict(self, own: dict[str, Any]) -> None:
        """Continue from the rank's checkpoint state."""

    def meta(self) -> dict[str, Any]:
        """This axis' entries of the checkpoint's metadata."""
        return {}

    def telemetry(self) -> Telemetry:
        return Telemetry()


class ParallelMode(ABC):
    """One placement of the tables on ``spec.world_size`` processes (see the module doc).

    Subclasses set ``name`` and ``embeddings``, build this rank's embedding module
    (``shard_embeddings``) and say how their state is checkpointed (``checkpoint_format``);
    the other methods have defaults for a mode whose tables train as ordinary parameters.
    ``self.env`` is the ranks the axes leave for sharding.
    """

    name: ClassVar[str]
    """The mode's name, as errors and the docs call it."""
    embeddings: ClassVar[EmbeddingLayout]

    def __init__(self, ctx: RunContext, spec: ParallelSpec, axes: list[Axis] | None = None) -> None:
        self.ctx, self.spec = ctx, spec
        self.axes = list(axes or [])
        env = ShardingEnv(None, ctx.world_size, ctx.rank)
        for axis in self.axes:
            env = axis.sharding_env(env)
        self.env = env
        self.plan: ShardingPlan | None = None
        self.model: RecommendationModel | None = None
        self.train_step: TrainingStep | None = None

    @classmethod
    def check(cls, cfg: RunConfig, world_size: int, tables: list[TableConfig]) -> None:
        """Raise DistrecError (one line) for a setting this mode cannot train with these
        tables; called before any process starts, so it may use no process group."""

    def model_layout(self) -> ModelLayout:
        """The tables and towers to build the model with (default: the real tables, no towers)."""
        return ModelLayout(self.ctx.tables)

    @abstractmethod
    def shard_embeddings(self, model: RecommendationModel) -> None:
        """Replace ``model.embeddings`` (built on the host) by this rank's embedding module,
        sharded over ``self.env``."""

    def wrap_dense(self, model: RecommendationModel) -> nn.Module:
        """The module to call, after the model moved to the device (e.g. DDP over dense layers)."""
        return model

    def make_step(self, model: RecommendationModel, module: nn.Module, optimization: Optimization) -> TrainingStep:
        """The training step of ``module`` (whose unwrapped model is ``model``), with the
        optimizers and schedules ``optimization`` makes (default: forward, backward, step)."""
        optimizers = optimization.optimizers(model)
        return TrainStep(module, optimizers, optimization.schedulers(optimizers), timer=self.ctx.timer)

    @abstractmethod
    def checkpoint_format(self) -> CheckpointFormat:
        """The checkpoint part holding this rank's model, optimizers and the mode's state."""

    def telemetry(self) -> list[Telemetry]:
        """What the mode and its axes report while training."""
        return [axis.telemetry() for axis in self.axes]

    def close(self) -> None:
        """Release what outlives a step (worker threads, files)."""


@dataclass
class Parallelized:
    """A model as this rank trains it."""

    module: nn.Module
    """What to call: ``module(batch) -> logits [b]`` (the model, or its data-parallel wrapper)."""
    model: RecommendationModel
    """The model itself, its ``embeddings`` replaced by this rank's."""
    train_step: TrainingStep
    checkpoint: CheckpointFormat
    telemetry: list[Telemetry] = field(default_factory=list)


def parallelize(model: RecommendationModel, mode: ParallelMode, optimization: Optimization) -> Parallelized:
    """Apply ``mode`` to ``model`` (built identically on every rank, on the host), in a fixed
    order: this rank's embeddings (then the axes' groups), the move to its device, dense data
    parallelism, the step with ``optimization``'s optimizers."""
    mode.shard_embeddings(model)
    for axis in mode.axes:
        axis.after_sharding(mode, model)
    model.to(mode.ctx.device)
    module = mode.wrap_dense(model)
    mode.model = model
    mode.train_step = mode.make_step(model, module, optimization)
    return Parallelized(module, model, mode.train_step, mode.checkpoint_format(), mode.telemetry())
