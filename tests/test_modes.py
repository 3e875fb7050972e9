"""The parallel modes: which config each picks, the combination rules, and adding a mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import Optimizer

from distrec import config, modes
from distrec.components.step import TrainStep
from distrec.errors import DistrecError
from distrec.hotline.replicated_mode import ReplicatedHotline
from distrec.hotline.tiers_mode import HotlineTiers
from distrec.models.base import RecommendationModel
from distrec.parallel.block_mode import BlockMode
from distrec.parallel.local import LocalEmbeddings
from distrec.parallel.mode import TrainingStep
from distrec.parallel.sharded import Sharded
from distrec.parallel.single import SingleProcess
from distrec.parallel.sptt_mode import Sptt, SpttTowers
from distrec.parallel.two_d import TwoD, TwoDSptt, TwoDSpttTowers
from distrec.train.evaluate import load_trained_model
from distrec.train.loop import Trainer
from tiny_runs import tiny_config

MODE_OF = [
    ([], 1, SingleProcess),
    (["model.tower_module=dlrm", "parallel.hosts=2", "parallel.ranks_per_host=1"], 1, SingleProcess),
    (["hotline.enabled=true"], 1, HotlineTiers),
    ([], 4, Sharded),
    (["parallel.sharding=column_wise"], 2, Sharded),
    (["parallel.embeddings=local"], 2, LocalEmbeddings),
    (["parallel.lookup=sptt"], 4, Sptt),
    (["parallel.lookup=sptt", "model.tower_module=dlrm", "parallel.hosts=2", "parallel.ranks_per_host=2"], 4, SpttTowers),
    (["hotline.enabled=true"], 2, ReplicatedHotline),
    (["parallel.replica_groups=2"], 4, TwoD),
    (["parallel.replica_groups=2", "parallel.lookup=sptt", "parallel.hosts=4", "parallel.ranks_per_host=2"], 8, TwoDSptt),
    (["parallel.replica_groups=2", "parallel.lookup=sptt", "model.tower_module=dlrm", "parallel.hosts=4", "parallel.ranks_per_host=2"], 8, TwoDSpttTowers),
]


@pytest.mark.parametrize("overrides, world_size, expected", MODE_OF)
def test_each_config_gets_its_mode(overrides, world_size, expected):
    assert modes.select_mode(config.load(None, overrides, preset="tiny"), world_size) is expected


@pytest.mark.parametrize(
    "overrides, world_size, message",
    [
        (["parallel.embeddings=local", "hotline.enabled=true"], 2, "distributed Hotline needs sharded embeddings"),
        (["hotline.enabled=true", "train.optimizer=adam"], 2, "distributed Hotline trains embeddings with sgd or adagrad"),
        (["model.tower_module=dlrm", "parallel.hosts=2", "parallel.ranks_per_host=1"], 2, "needs --lookup sptt"),
    ],
)
def test_combinations_that_need_the_world_size_are_refused_by_select_mode(overrides, world_size, message):
    cfg = config.load(None, overrides, preset="tiny")  # fine in one process
    assert modes.select_mode(cfg, 1) is not None
    with pytest.raises(DistrecError, match=message):
        modes.select_mode(cfg, world_size)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parallel.lookup=sptt", "parallel.embeddings=local"], "places the tables by tower itself"),
        (["model.tower_module=dlrm", "parallel.hosts=2", "parallel.ranks_per_host=1", "hotline.enabled=true"], "cannot be combined"),
        (["hotline.enabled=true", "train.embedding_weight_decay=0.1"], "not supported with --hotline yet"),
    ],
)
def test_combinations_refused_whatever_the_world_size_fail_when_the_config_loads(overrides, message):
    with pytest.raises(DistrecError, match=message):
        config.load(None, overrides, preset="tiny")


def test_every_listed_mode_is_chosen_for_some_config():
    assert {expected for _, _, expected in MODE_OF} == set(modes.MODES)


class FrozenTables(BlockMode):
    """A toy mode for the test: one process, the tables kept at their initial weights."""

    name = "frozen-tables"
    embeddings = "single"

    @classmethod
    def accepts(cls, cfg: config.RunConfig, world_size: int) -> bool:
        return world_size == 1

    def make_step(self, model: RecommendationModel, module: nn.Module) -> TrainingStep:
        for p in model.sparse_parameters():
            p.requires_grad_(False)
        optimizers: list[Optimizer] = [torch.optim.SGD(model.dense_parameters(), lr=self.ctx.cfg.train.lr)]
        return TrainStep(module, optimizers)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "frozen": True}


def test_a_new_mode_is_one_class_named_in_one_list(tmp_path: Path, monkeypatch):
    """Adding a mode touches neither the trainer nor the checkpoint code."""
    monkeypatch.setattr(modes, "MODES", [FrozenTables, *modes.MODES])
    cfg = tiny_config(tmp_path / "cache", steps=4)
    trainer = Trainer(cfg, tmp_path / "run", progress=False)
    assert isinstance(trainer.mode, FrozenTables)
    initial_tables = trainer.model.embeddings.weight.detach().clone()
    initial_dense = [p.detach().clone() for p in trainer.model.dense_parameters()]
    summary = trainer.fit()
    assert summary["steps"] == 4
    assert torch.equal(trainer.model.embeddings.weight, initial_tables)
    assert any(not torch.equal(a, b) for a, b in zip(initial_dense, trainer.model.dense_parameters()))
    model, *_ = load_trained_model(tmp_path / "run")  # the checkpoint is an ordinary block one
    assert torch.equal(model.embeddings.weight, initial_tables)
