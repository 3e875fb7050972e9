"""TrainStep: losses, micro-batch equivalence, optimizer and schedule stepping."""

from __future__ import annotations

import pytest
import torch

from distrec.components.optim import make_optimizers
from distrec.components.schedule import make_schedulers
from distrec.components.step import TrainStep
from distrec.config import ModelConfig, apply_preset
from distrec.data.batch import Batch
from distrec.models.build import build_model
from distrec.tables import TableConfig

TABLES = [TableConfig("user", 20, 8), TableConfig("item", 30, 8, multi_hot=True)]


def learnable_batch(batch_size: int = 64, seed: int = 0) -> Batch:
    """Labels decided by the user id's parity and a dense feature: a model can fit them."""
    g = torch.Generator().manual_seed(seed)
    users = torch.randint(0, 20, (batch_size,), generator=g)
    lengths = torch.randint(1, 3, (batch_size,), generator=g)
    items = torch.randint(0, 30, (int(lengths.sum()),), generator=g)
    offsets = torch.cat([torch.arange(batch_size + 1), batch_size + torch.cumsum(lengths, 0)])
    dense = torch.randn(batch_size, 3, generator=g)
    labels = ((users % 2 == 0) & (dense[:, 0] > -1)).float()
    return Batch(dense, torch.cat([users, items]), offsets, labels)


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig()
    apply_preset(cfg, "tiny")
    return build_model(cfg, 3, TABLES)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_a_few_steps_reduce_the_loss(optimizer):
    model = tiny_model()
    lr = {"sgd": 0.5, "adagrad": 0.1, "adam": 0.01}[optimizer]
    step = TrainStep(model, make_optimizers(model, optimizer, lr))
    batch = learnable_batch()
    first = float(step(batch))
    for _ in range(40):
        last = step(batch)
    assert last.requires_grad is False and last.dim() == 0
    assert float(last) < 0.3 * first


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_micro_batches_normalised_by_the_batch_size_equal_one_step(optimizer):
    batch = learnable_batch(batch_size=32, seed=1)
    whole = tiny_model(seed=3)
    whole_step = TrainStep(whole, make_optimizers(whole, optimizer, 0.05))
    split = tiny_model(seed=3)
    split_step = TrainStep(split, make_optimizers(split, optimizer, 0.05))
    popular = torch.arange(0, 32, 3)
    rest = torch.tensor([i for i in range(32) if i % 3])
    for _ in range(3):
        loss = whole_step(batch)
        parts = [split_step.backward(batch.select(rows), normalizer=batch.batch_size) for rows in (popular, rest)]
        split_step.apply()
        torch.testing.assert_close(sum(parts), loss)
    for (name, a), b in zip(whole.named_parameters(), split.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)


def test_apply_clears_gradients_and_steps_the_schedule():
    model = tiny_model()
    optimizers = make_optimizers(model, "sgd", 0.4)
    step = TrainStep(model, optimizers, make_schedulers(optimizers, warmup_steps=4))
    batch = learnable_batch()
    assert [opt.param_groups[0]["lr"] for opt in optimizers] == [0.1, 0.1]
    step.backward(batch)
    assert model.embeddings.weight.grad is not None
    step.apply()
    assert all(p.grad is None for p in model.parameters())
    assert [opt.param_groups[0]["lr"] for opt in optimizers] == [0.2, 0.2]


def test_loss_mean_and_normalised_sum_agree():
    model = tiny_model()
    step = TrainStep(model, make_optimizers(model, "sgd", 0.1))
    batch = learnable_batch(batch_size=16)
    with torch.no_grad():
        torch.testing.assert_close(step.loss(batch), step.loss(batch, normalizer=16))
        torch.testing.assert_close(step.loss(batch, normalizer=32), step.loss(batch) / 2)
