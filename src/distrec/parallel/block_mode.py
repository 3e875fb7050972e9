"""BlockMode: what every mode shares whose tables train as ordinary parameters, checkpointed as blocks.

Every mode but Hotline's one-process tiers keeps the tables in ordinary modules (whole,
sharded, by tower, behind a hot replica) and trains them with one sparse row optimizer
beside the dense ones. They apply the other axes (``Axis``: replica groups, ...) at the
same points: the gradient sync, the step, the checkpoint. Their checkpoints have one layout
(``BlockFormat``, tag ``blocks``), read by any of them at any world size
(``distrec.parallel.reshard``): per rank, ``dense`` (the model without its tables),
``dense_optimizers``, ``sparse_groups`` (the sparse optimizer's hyperparameters), ``blocks``
(table blocks with their row state), ``towers`` and ``tower_groups`` (DMT's tower modules,
saved by one rank per tower) and ``schedulers``, plus the axes' entries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn
from torch.optim import Optimizer

from distrec.components.optim import SparseRowOptimizer, optimizer_of
from distrec.components.optimization import Optimization
from distrec.components.step import TrainStep
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.models.dmt_cost import dmt_cost
from distrec.parallel.mode import CheckpointFormat, GradientSync, ParallelMode, Telemetry, TrainingStep
from distrec.parallel.parallelize import dense_data_parallel
from distrec.parallel.reshard import export_blocks, restore_embeddings
from distrec.parallel.tower_state import export_towers, restore_towers


def hyperparameters(optimizer: Optimizer | None) -> list[dict[str, Any]]:
    """The param groups of ``optimizer`` without their parameters (learning rates and the like)."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] if optimizer else []


class BlockMode(ParallelMode):
    """Base of the modes whose tables are ordinary parameters (see the module doc)."""

    def wrap_dense(self, model: RecommendationModel) -> nn.Module:
        """Several processes: DDP over the dense layers (the tables excluded), its all-reduces timed."""
        if self.ctx.world_size == 1:
            return model
        ddp = dense_data_parallel(model, self.ctx.device)
        self.ctx.timer.watch_ddp(ddp)
        return ddp

    def make_step(self, model: RecommendationModel, module: nn.Module, optimization: Optimization) -> TrainingStep:
        """Forward and backward through ``module``, then ``optimization``'s optimizers and
        schedulers, with the gradient sync of the mode and its axes in between, and each
        axis' additions to the step.

        When no sync reads the embedding gradients, the sparse optimizer steps the rows in
        backward (``SparseRowOptimizer.update_in_backward``).
        """
        optimizers = optimization.optimizers(model)
        schedulers = optimization.schedulers(optimizers)
        sync = self.gradient_sync(model)
        for axis in self.axes:
            sync = axis.gradient_sync(self, model, sync)
        if sync is None or not sync.reads_row_gradients:
            for optimizer in optimizers:
                if isinstance(optimizer, SparseRowOptimizer):
                    optimizer.update_in_backward()
        step: TrainingStep = TrainStep(module, optimizers, schedulers, timer=self.ctx.timer, sync_gradients=sync.run if sync is not None else None)
        for axis in self.axes:
            step = axis.wrap_step(step)
        return step

    def gradient_sync(self, model: RecommendationModel) -> GradientSync | None:
        """What the mode runs between backward and the optimizers (None: nothing)."""
        return None

    def telemetry(self) -> list[Telemetry]:
        own = Telemetry(summary=self._dmt_summary) if self.ctx.cfg.model.tower_module is not None else Telemetry()
        return [own, *super().telemetry()]

    def _dmt_summary(self) -> dict[str, Any]:
        return {"dmt": dmt_cost(self.ctx.cfg.model, self.ctx.num_dense, self.ctx.tables, self.model_layout().towers)}

    def checkpoint_format(self) -> CheckpointFormat:
        return BlockFormat(self)

    # --- what the block format reads ---------------------------------------------------------
    def block_module(self) -> nn.Module:
        """The module holding this rank's table blocks."""
        return self.model.embeddings

    def export_table_blocks(self, sparse: Optimizer | None) -> list[dict[str, Any]]:
        """This rank's table blocks with their row state (replicas from rank 0 only)."""
        return export_blocks(self.block_module(), sparse, include_replicas=self.ctx.rank == 0)

    def optimizers(self) -> tuple[Optimizer | None, Optimizer | None, list[Optimizer]]:
        """The sparse optimizer, the tower modules' and the dense ones."""
        optimizers = self.train_step.optimizers
        sparse = next((o for o in optimizers if isinstance(o, SparseRowOptimizer)), None)
        towers = optimizer_of(optimizers, self.model.tower_parameters())
        return sparse, towers, [o for o in optimizers if o is not sparse and o is not towers]

    def tower_meta(self) -> dict[str, Any] | None:
        """Each tower's feature names and the rank whose state holds its module (None without towers)."""
        towers = self.model_layout().towers
        if towers is None or self.ctx.cfg.model.tower_module is None:
            return None
        ranks_per_host = self.ctx.world_size // len(towers) if self.ctx.world_size > 1 else 0
        return {
            "features": [[self.ctx.tables[f].name for f in tower] for tower in towers],
            "rank": [t * ranks_per_host for t in range(len(towers))],
        }


class BlockFormat(CheckpointFormat):
    """The checkpoint layout of every ``BlockMode`` (see the module doc)."""

    tag = "blocks"

    def __init__(self, mode: BlockMode) -> None:
        self.mode = mode

    def state_dict(self) -> dict[str, Any]:
        m = self.mode
        for axis in m.axes:
            axis.before_save()
        sparse, towers, dense = m.optimizers()
        meta = m.tower_meta()
        exported = all(axis.exports_blocks() for axis in m.axes)
        state = {
            "dense": {k: v for k, v in m.model.state_dict().items() if not k.startswith("embeddings.")},
            "dense_optimizers": [o.state_dict() for o in dense],
            "sparse_groups": hyperparameters(sparse),
            "blocks": m.export_table_blocks(sparse) if exported else [],
            "towers": export_towers(m.model.embeddings, towers) if meta is not None and m.ctx.rank in meta["rank"] else [],
            "tower_groups": hyperparameters(towers),
            "schedulers": [s.state_dict() for s in m.train_step.schedulers],
        }
        for axis in m.axes:
            state.update(axis.state_dict())
        return state

    def load_state_dict(self, own: dict[str, Any], checkpoint: Path, meta: dict[str, Any]) -> None:
        m = self.mode
        missing, unexpected = m.model.load_state_dict(own["dense"], strict=False)
        if unexpected or any(not k.startswith("embeddings.") for k in missing):
            raise DistrecError(f"checkpoint {str(checkpoint)!r} holds a different model; resume it with the config it was saved with")
        sparse, towers, dense = m.optimizers()
        restore_embeddings(checkpoint, meta, m.block_module(), sparse, m.ctx.rank)
        restore_towers(checkpoint, meta, m.model.embeddings, towers)
        for o, s in zip(dense, own["dense_optimizers"]):
            o.load_state_dict(s)
        for optimizer, saved_groups in ((sparse, own["sparse_groups"]), (towers, own.get("tower_groups", []))):
            if optimizer is not None:
                for group, saved in zip(optimizer.param_groups, saved_groups):
                    group.update(saved)
        for scheduler, s in zip(m.train_step.schedulers, own["schedulers"]):
            scheduler.load_state_dict(s)
        for axis in m.axes:
            axis.load_state_dict(own)

    def meta(self) -> dict[str, Any]:
        m = self.mode
        meta = {"embeddings": m.embeddings, "plan": m.plan.to_dict() if m.plan is not None else None, "towers": m.tower_meta()}
        for axis in m.axes:
            meta.update(axis.meta())
        return meta

    @classmethod
    def restore_model(cls, model: RecommendationModel, checkpoint: Path, own: dict[str, Any], meta: dict[str, Any]) -> None:
        model.load_state_dict(own["dense"], strict=False)
        restore_embeddings(checkpoint, meta, model.embeddings, None, rank=0)
        restore_towers(checkpoint, meta, model.embeddings, None)
