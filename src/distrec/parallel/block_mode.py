"""BlockMode: what every mode shares whose checkpoint stores the tables as blocks.

Every mode but Hotline's one-process tiers keeps the tables in ordinary modules (whole,
sharded, by tower, behind a hot replica) and trains them with one sparse row optimizer
beside the dense ones. Their checkpoints have one layout, read by any of them at any world
size (``distrec.parallel.reshard``): per rank, ``dense`` (the model without its tables),
``dense_optimizers``, ``sparse_groups`` (the sparse optimizer's hyperparameters),
``blocks`` (table blocks with their row state), ``towers`` and ``tower_groups`` (DMT's
tower modules, saved by one rank per tower) and ``schedulers``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn
from torch.optim import Optimizer

from distrec.components.optim import SparseRowOptimizer, make_optimizers, optimizer_of
from distrec.components.schedule import make_schedulers
from distrec.components.step import TrainStep
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.models.dmt_cost import dmt_cost
from distrec.parallel.mode import ParallelMode, TrainingStep
from distrec.parallel.parallelize import dense_data_parallel
from distrec.parallel.reshard import export_blocks, restore_embeddings
from distrec.parallel.tower_state import export_towers, restore_towers


def hyperparameters(optimizer: Optimizer | None) -> list[dict[str, Any]]:
    """The param groups of ``optimizer`` without their parameters (learning rates and the like)."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] if optimizer else []


class BlockMode(ParallelMode):
    """Base of the modes that checkpoint their tables as blocks (see the module doc)."""

    def wrap_dense(self, model: RecommendationModel) -> nn.Module:
        """Several processes: DDP over the dense layers (the tables excluded), its all-reduces timed."""
        if self.ctx.world_size == 1:
            return model
        ddp = dense_data_parallel(model, self.ctx.device)
        self.ctx.timer.watch_ddp(ddp)
        return ddp

    def make_step(self, model: RecommendationModel, module: nn.Module) -> TrainingStep:
        """Forward and backward through ``module``, then the dense, tower and sparse optimizers
        of ``cfg.train`` and their schedulers, with ``gradient_sync`` in between.

        When the gradient sync does not read the embedding gradients (``reads_row_gradients``),
        the sparse optimizer steps the rows in backward (``SparseRowOptimizer.update_in_backward``).
        """
        t = self.ctx.cfg.train
        optimizers = make_optimizers(model, t.optimizer, t.lr, t.embedding_optimizer, t.embedding_lr, t.weight_decay, t.embedding_weight_decay)
        schedulers = make_schedulers(optimizers, t.warmup_steps, t.decay, t.decay_start_step, t.decay_steps or self.ctx.total_steps)
        sync = self.gradient_sync(model)
        if not self.reads_row_gradients(sync):
            for optimizer in optimizers:
                if isinstance(optimizer, SparseRowOptimizer):
                    optimizer.update_in_backward()
        return TrainStep(module, optimizers, schedulers, timer=self.ctx.timer, sync_gradients=sync)

    def gradient_sync(self, model: RecommendationModel) -> Callable[[], None] | None:
        """What to run between backward and the optimizers (e.g. all-reduce replicated rows)."""
        return None

    def reads_row_gradients(self, sync: Callable[[], None] | None) -> bool:
        """Whether ``sync`` (``gradient_sync``'s) reads the embedding gradients, which must then
        be made (the rows are not stepped in backward); any sync does unless a mode says otherwise."""
        return sync is not None

    def summary_extra(self) -> dict[str, Any]:
        cfg = self.ctx.cfg
        if cfg.model.tower_module is None:
            return {}
        return {"dmt": dmt_cost(cfg.model, self.ctx.num_dense, self.ctx.tables, self.towers())}

    # --- checkpoints ---------------------------------------------------------------------
    def block_module(self) -> nn.Module:
        """The module holding this rank's table blocks."""
        return self.model.embeddings

    def export_table_blocks(self, sparse: Optimizer | None) -> list[dict[str, Any]]:
        """This rank's table blocks with their row state (replicas from rank 0 only)."""
        return export_blocks(self.block_module(), sparse, include_replicas=self.ctx.rank == 0)

    def _optimizers(self) -> tuple[Optimizer | None, Optimizer | None, list[Optimizer]]:
        """The sparse optimizer, the tower modules' and the dense ones."""
        optimizers = self.step.optimizers
        sparse = next((o for o in optimizers if isinstance(o, SparseRowOptimizer)), None)
        towers = optimizer_of(optimizers, self.model.tower_parameters())
        return sparse, towers, [o for o in optimizers if o is not sparse and o is not towers]

    def tower_meta(self) -> dict[str, Any] | None:
        """Each tower's feature names and the rank whose state holds its module (None without towers)."""
        towers = self.towers()
        if towers is None or self.ctx.cfg.model.tower_module is None:
            return None
        ranks_per_host = self.ctx.world_size // len(towers) if self.ctx.world_size > 1 else 0
        return {
            "features": [[self.ctx.tables[f].name for f in tower] for tower in towers],
            "rank": [t * ranks_per_host for t in range(len(towers))],
        }

    def state_dict(self) -> dict[str, Any]:
        sparse, towers, dense = self._optimizers()
        meta = self.tower_meta()
        return {
            "dense": {k: v for k, v in self.model.state_dict().items() if not k.startswith("embeddings.")},
            "dense_optimizers": [o.state_dict() for o in dense],
            "sparse_groups": hyperparameters(sparse),
            "blocks": self.export_table_blocks(sparse),
            "towers": export_towers(self.model.embeddings, towers) if meta is not None and self.ctx.rank in meta["rank"] else [],
            "tower_groups": hyperparameters(towers),
            "schedulers": [s.state_dict() for s in self.step.schedulers],
        }

    def load_state_dict(self, own: dict[str, Any], checkpoint: Path, meta: dict[str, Any]) -> None:
        missing, unexpected = self.model.load_state_dict(own["dense"], strict=False)
        if unexpected or any(not k.startswith("embeddings.") for k in missing):
            raise DistrecError(f"checkpoint {str(checkpoint)!r} holds a different model; resume it with the config it was saved with")
        sparse, towers, dense = self._optimizers()
        restore_embeddings(checkpoint, meta, self.block_module(), sparse, self.ctx.rank)
        restore_towers(checkpoint, meta, self.model.embeddings, towers)
        for o, s in zip(dense, own["dense_optimizers"]):
            o.load_state_dict(s)
        for optimizer, saved_groups in ((sparse, own["sparse_groups"]), (towers, own.get("tower_groups", []))):
            if optimizer is not None:
                for group, saved in zip(optimizer.param_groups, saved_groups):
                    group.update(saved)
        for scheduler, s in zip(self.step.schedulers, own["schedulers"]):
            scheduler.load_state_dict(s)

    def checkpoint_meta(self) -> dict[str, Any]:
        return {**super().checkpoint_meta(), "towers": self.tower_meta()}

    @classmethod
    def wrote(cls, own: dict[str, Any], meta: dict[str, Any]) -> bool:
        return "dense" in own and "hotline" not in own

    @classmethod
    def restore_model(cls, model: RecommendationModel, checkpoint: Path, own: dict[str, Any], meta: dict[str, Any]) -> None:
        model.load_state_dict(own["dense"], strict=False)
        restore_embeddings(checkpoint, meta, model.embeddings, None, rank=0)
        restore_towers(checkpoint, meta, model.embeddings, None)
