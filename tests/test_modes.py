"""The parallel axes: which spec and mode each config gets, the combination rules, and adding
an axis value (a placement or another axis) as one component and one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import Optimizer

from distrec import config, modes
from distrec.components.optimization import Optimization
from distrec.components.step import TrainStep
from distrec.errors import DistrecError
from distrec.hotline.replicated_mode import ReplicatedHotline
from distrec.hotline.tiers_mode import HotlineTiers
from distrec.models.base import RecommendationModel
from distrec.parallel.local import LocalEmbeddings
from distrec.parallel.mode import Axis, ParallelMode, Telemetry, TrainingStep
from distrec.parallel.sharded import Sharded
from distrec.parallel.single import SingleProcess
from distrec.parallel.spec import ParallelSpec
from distrec.parallel.sptt_mode import Sptt
from distrec.train.evaluate import load_trained_model
from distrec.train.loop import Trainer
from tiny_runs import tiny_config

TOWERS_2X2 = ["model.tower_module=dlrm", "parallel.hosts=2", "parallel.ranks_per_host=2"]
SPEC_OF = [
    ([], 1, ParallelSpec(1, 1, "single", False), SingleProcess),
    (["model.tower_module=dlrm", "parallel.hosts=2", "parallel.ranks_per_host=1"], 1, ParallelSpec(1, 1, "single", True), SingleProcess),
    (["hotline.enabled=true"], 1, ParallelSpec(1, 1, "hotline-tiers", False), HotlineTiers),
    ([], 4, ParallelSpec(4, 1, "sharded", False), Sharded),
    (["parallel.sharding=column_wise"], 2, ParallelSpec(2, 1, "sharded", False), Sharded),
    (["parallel.embeddings=local"], 2, ParallelSpec(2, 1, "local", False), LocalEmbeddings),
    (["parallel.lookup=sptt"], 4, ParallelSpec(4, 1, "sptt", False), Sptt),
    (["parallel.lookup=sptt", *TOWERS_2X2], 4, ParallelSpec(4, 1, "sptt", True), Sptt),
    (["hotline.enabled=true"], 2, ParallelSpec(2, 1, "hotline-replicated", False), ReplicatedHotline),
    (["parallel.replica_groups=2"], 4, ParallelSpec(4, 2, "sharded", False), Sharded),
    (["parallel.replica_groups=2", "parallel.lookup=sptt", "parallel.hosts=4", "parallel.ranks_per_host=2"], 8, ParallelSpec(8, 2, "sptt", False), Sptt),
    (
        ["parallel.replica_groups=2", "parallel.lookup=sptt", "model.tower_module=dlrm", "parallel.hosts=4", "parallel.ranks_per_host=2"],
        8,
        ParallelSpec(8, 2, "sptt", True),
        Sptt,
    ),
]


@pytest.mark.parametrize("overrides, world_size, spec, mode", SPEC_OF)
def test_each_config_gets_its_axes_and_mode(overrides, world_size, spec, mode):
    cfg = config.load(None, overrides, preset="tiny")
    assert ParallelSpec.of(cfg, world_size) == spec
    assert modes.select_mode(cfg, world_size) is mode
    assert spec.group_size * spec.replica_groups == world_size


@pytest.mark.parametrize(
    "overrides, world_size, message",
    [
        (["parallel.embeddings=local", "hotline.enabled=true"], 2, "distributed Hotline needs sharded embeddings"),
        (["hotline.enabled=true", "train.optimizer=adam"], 2, "distributed Hotline trains embeddings with sgd or adagrad"),
        (["model.tower_module=dlrm", "parallel.hosts=2", "parallel.ranks_per_host=1"], 2, "needs --lookup sptt"),
        (["parallel.replica_groups=3"], 4, "must divide"),
    ],
)
def test_combinations_that_need_the_world_size_are_refused_by_the_spec(overrides, world_size, message):
    cfg = config.load(None, overrides, preset="tiny")  # loads: the world size is not known yet
    with pytest.raises(DistrecError, match=message):
        ParallelSpec.of(cfg, world_size)


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


def test_every_placement_is_chosen_for_some_config():
    assert {spec.placement for _, _, spec, _ in SPEC_OF} == set(modes.PLACEMENTS)


def test_no_mode_derives_from_two_modes():
    for mode in modes.PLACEMENTS.values():
        assert sum(issubclass(base, ParallelMode) for base in mode.__bases__) == 1, mode


def test_every_format_tag_names_its_format_and_old_checkpoints_are_recognised_by_their_keys():
    assert {tag: f.tag for tag, f in modes.FORMATS.items()} == {tag: tag for tag in modes.FORMATS}
    assert modes.format_tag({"dense": {}}, {}) == "blocks"
    assert modes.format_tag({"dense": {}, "hotline": {}}, {}) == "hotline-replicated"
    assert modes.format_tag({"hotline": {}}, {}) == "hotline-tiers"
    assert modes.format_tag({"dense": {}}, {"format": "hotline-tiers"}) == "hotline-tiers"
    with pytest.raises(DistrecError, match="format 'future'"):
        modes.saved_format(Path("ckpt"), {}, {"format": "future"})


class FrozenTables(SingleProcess):
    """A toy placement for the test: one process, the tables kept at their initial weights."""

    def make_step(self, model: RecommendationModel, module: nn.Module, optimization: Optimization) -> TrainingStep:
        for p in model.sparse_parameters():
            p.requires_grad_(False)
        optimizers: list[Optimizer] = [torch.optim.SGD(model.dense_parameters(), lr=optimization.lr)]
        return TrainStep(module, optimizers)


def test_a_new_placement_is_one_class_and_one_line(tmp_path: Path, monkeypatch):
    """Replacing (or adding) a placement touches neither the trainer nor the checkpoint code."""
    monkeypatch.setitem(modes.PLACEMENTS, "single", FrozenTables)
    trainer = Trainer(tiny_config(tmp_path / "cache", steps=4), tmp_path / "run", progress=False)
    assert isinstance(trainer.mode, FrozenTables)
    initial_tables = trainer.model.embeddings.weight.detach().clone()
    initial_dense = [p.detach().clone() for p in trainer.model.dense_parameters()]
    summary = trainer.fit()
    assert summary["steps"] == 4
    assert torch.equal(trainer.model.embeddings.weight, initial_tables)
    assert any(not torch.equal(a, b) for a, b in zip(initial_dense, trainer.model.dense_parameters()))
    model, *_ = load_trained_model(tmp_path / "run")  # the checkpoint is an ordinary block one
    assert torch.equal(model.embeddings.weight, initial_tables)


class CountedSteps(Axis):
    """A toy axis for the test: counts the steps it wraps, reports and checkpoints the count."""

    def __init__(self) -> None:
        self.steps = 0

    def wrap_step(self, step: TrainingStep) -> TrainingStep:
        def counted(batch, normalizer=None):
            self.steps += 1
            return step(batch, normalizer)

        counted.optimizers, counted.schedulers = step.optimizers, step.schedulers  # type: ignore[attr-defined]
        return counted  # type: ignore[return-value]

    def state_dict(self) -> dict[str, Any]:
        return {"counted_steps": self.steps}

    def load_state_dict(self, own: dict[str, Any]) -> None:
        self.steps = own["counted_steps"]

    def meta(self) -> dict[str, Any]:
        return {"counted": True}

    def telemetry(self) -> Telemetry:
        return Telemetry(summary=lambda: {"counted_steps": self.steps})


def test_a_new_axis_is_one_component_and_one_line(tmp_path: Path, monkeypatch):
    """An axis applies to the step, the checkpoint and the summary of any block mode."""
    monkeypatch.setattr(modes, "AXES", [*modes.AXES, lambda ctx, spec: CountedSteps()])
    cfg = tiny_config(tmp_path / "cache", steps=3)
    trainer = Trainer(cfg, tmp_path / "run", progress=False)
    assert trainer.fit()["counted_steps"] == 3
    trainer.close()
    cfg.train.max_steps = 5
    resumed = Trainer(cfg, tmp_path / "run", progress=False)
    assert resumed.fit(resume=True)["counted_steps"] == 5  # 3 restored from the checkpoint, 2 more
    resumed.close()
