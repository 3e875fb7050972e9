"""Sparse row optimizers against dense references, state round trips, and the optimizer split."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from distrec.components import optim
from distrec.components.optim import LazyAdam, RowWiseAdagrad, SparseSGD, coalesced_rows, make_optimizers
from distrec.components.step import TrainStep
from distrec.config import ModelConfig, apply_preset
from distrec.errors import DistrecError
from distrec.models.build import build_model
from distrec.tables import TableConfig
from test_models import random_batch, single_hot_batch

ROWS, DIM = 12, 5


@pytest.fixture(autouse=True, params=[1024, 2], ids=["one-block", "blocks-of-2"])
def rows_per_block(request, monkeypatch):
    """Run every test with all rows in one block and with many small blocks."""
    monkeypatch.setattr(optim, "ROWS_PER_BLOCK", request.param)
    monkeypatch.setattr(optim, "DISTINCT_ROWS_PER_BLOCK", request.param)


def sparse_grad(rows: list[int], seed: int) -> torch.Tensor:
    """An uncoalesced sparse row gradient with one entry per listed row (repeats allowed)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(len(rows), DIM, generator=g, dtype=torch.float64)
    return torch.sparse_coo_tensor(torch.tensor([rows]), values, (ROWS, DIM), check_invariants=True)


def start_weight() -> torch.Tensor:
    return torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


STEPS = [[1, 4, 4, 7], [0, 4, 11], [7, 7, 7, 2]]


def run(optimizer_cls, grads: list[torch.Tensor], **kwargs) -> tuple[nn.Parameter, torch.optim.Optimizer]:
    param = nn.Parameter(start_weight())
    opt = optimizer_cls([param], **kwargs)
    for grad in grads:
        param.grad = grad
        opt.step()
    return param, opt


def test_gradients_with_distinct_increasing_rows_count_as_coalesced_without_the_flag():
    values = torch.randn(3, DIM, dtype=torch.float64)
    grad = torch.sparse_coo_tensor(torch.tensor([[1, 4, 9]]), values, (ROWS, DIM), check_invariants=True)
    assert not grad.is_coalesced() and optim.has_distinct_rows(grad)
    assert coalesced_rows(grad)[1].data_ptr() == values.data_ptr()  # taken as is, not summed again
    assert not optim.has_distinct_rows(sparse_grad([1, 4, 4], seed=0))
    assert not optim.has_distinct_rows(sparse_grad([4, 1], seed=0))


def test_coalesced_rows_sums_repeats():
    grad = sparse_grad([3, 1, 3], seed=0)
    rows, summed = coalesced_rows(grad)
    values = grad._values()
    assert rows.tolist() == [1, 3]
    torch.testing.assert_close(summed, torch.stack([values[1], values[0] + values[2]]))


def test_sparse_sgd_equals_torch_sgd_on_the_dense_gradient():
    grads = [sparse_grad(rows, seed=i) for i, rows in enumerate(STEPS)]
    param, _ = run(SparseSGD, grads, lr=0.3)
    reference, _ = run(torch.optim.SGD, [g.to_dense() for g in grads], lr=0.3)
    torch.testing.assert_close(param, reference, rtol=0, atol=1e-15)
    untouched = [3, 5, 6, 8, 9, 10]
    assert torch.equal(param.data[untouched], start_weight()[untouched])


def test_row_wise_adagrad_follows_its_formula():
    grads = [sparse_grad(rows, seed=i) for i, rows in enumerate(STEPS)]
    param, opt = run(RowWiseAdagrad, grads, lr=0.1, eps=1e-10)
    weight, accumulator = start_weight(), torch.zeros(ROWS, dtype=torch.float64)
    for grad in grads:
        dense = grad.to_dense()
        for r in sorted(set(grad._indices()[0].tolist())):
            accumulator[r] += (dense[r] ** 2).mean()
            weight[r] -= 0.1 * dense[r] / (accumulator[r].sqrt() + 1e-10)
    torch.testing.assert_close(param.data, weight)
    torch.testing.assert_close(opt.state[param]["sum"], accumulator)


def test_lazy_adam_equals_torch_adam_when_every_row_is_touched():
    everything = list(range(ROWS))
    grads = [sparse_grad(everything + [3], seed=i) for i in range(4)]
    param, _ = run(LazyAdam, grads, lr=0.01)
    reference, _ = run(torch.optim.Adam, [g.to_dense() for g in grads], lr=0.01)
    torch.testing.assert_close(param, reference)


def test_lazy_adam_updates_only_touched_rows_and_their_moments():
    grads = [sparse_grad(rows, seed=i) for i, rows in enumerate(STEPS)]
    lr, (beta1, beta2), eps = 0.01, (0.9, 0.999), 1e-8
    param, opt = run(LazyAdam, grads, lr=lr)
    weight = start_weight()
    m, v = torch.zeros_like(weight), torch.zeros_like(weight)
    for step, grad in enumerate(grads, start=1):
        dense = grad.to_dense()
        for r in sorted(set(grad._indices()[0].tolist())):
            m[r] = beta1 * m[r] + (1 - beta1) * dense[r]
            v[r] = beta2 * v[r] + (1 - beta2) * dense[r] ** 2
            denominator = (v[r] / (1 - beta2**step)).sqrt() + eps
            weight[r] -= lr / (1 - beta1**step) * m[r] / denominator
    torch.testing.assert_close(param.data, weight)
    torch.testing.assert_close(opt.state[param]["exp_avg"], m)
    assert opt.state[param]["step"] == 3
    assert torch.equal(param.data[5], start_weight()[5])


@pytest.mark.parametrize("sparse_cls, dense_cls", [(SparseSGD, torch.optim.SGD), (LazyAdam, torch.optim.Adam)])
def test_weight_decay_equals_torch_weight_decay_when_every_row_is_touched(sparse_cls, dense_cls):
    everything = list(range(ROWS))
    grads = [sparse_grad(everything + [3, 3], seed=i) for i in range(3)]
    param, _ = run(sparse_cls, grads, lr=0.05, weight_decay=0.1)
    reference, _ = run(dense_cls, [g.to_dense() for g in grads], lr=0.05, weight_decay=0.1)
    torch.testing.assert_close(param, reference)


@pytest.mark.parametrize("optimizer_cls", [SparseSGD, RowWiseAdagrad, LazyAdam])
def test_weight_decay_shrinks_only_the_touched_rows(optimizer_cls):
    grads = [sparse_grad(rows, seed=i) for i, rows in enumerate(STEPS)]
    plain, _ = run(optimizer_cls, grads, lr=0.05)
    decayed, _ = run(optimizer_cls, grads, lr=0.05, weight_decay=0.5)
    touched, untouched = [0, 1, 2, 4, 7, 11], [3, 5, 6, 8, 9, 10]
    assert torch.equal(decayed.data[untouched], start_weight()[untouched])
    assert not torch.allclose(decayed.data[touched], plain.data[touched])


def test_state_saved_without_weight_decay_loads_with_none():
    grads = [sparse_grad(rows, seed=i) for i, rows in enumerate(STEPS)]
    param, opt = run(SparseSGD, grads[:1], lr=0.05)
    state = opt.state_dict()
    del state["param_groups"][0]["weight_decay"]
    resumed = SparseSGD([param], lr=0.05)
    resumed.load_state_dict(state)
    param.grad = grads[1]
    resumed.step()
    assert resumed.param_groups[0]["weight_decay"] == 0.0


@pytest.mark.parametrize("optimizer_cls", [SparseSGD, RowWiseAdagrad, LazyAdam])
def test_state_dict_resumes_exactly(optimizer_cls):
    grads = [sparse_grad(rows, seed=i) for i, rows in enumerate(STEPS)]
    uninterrupted, _ = run(optimizer_cls, grads, lr=0.05)
    param, opt = run(optimizer_cls, grads[:2], lr=0.05)
    buffer = io.BytesIO()
    torch.save({"weight": param.detach(), "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)
    resumed = nn.Parameter(checkpoint["weight"])
    new_opt = optimizer_cls([resumed], lr=0.05)
    new_opt.load_state_dict(checkpoint["optimizer"])
    resumed.grad = grads[2]
    new_opt.step()
    assert torch.equal(resumed, uninterrupted)


def test_sparse_optimizers_reject_dense_gradients():
    param = nn.Parameter(torch.zeros(3, 2))
    param.grad = torch.ones(3, 2)
    with pytest.raises(TypeError, match="sparse gradients"):
        SparseSGD([param], lr=0.1).step()


def tiny_model() -> nn.Module:
    cfg = ModelConfig()
    apply_preset(cfg, "tiny")
    return build_model(cfg, 3, [TableConfig("a", 5, cfg.embedding_dim), TableConfig("b", 6, cfg.embedding_dim)])


@pytest.mark.parametrize(
    "name, embedding_name, dense_cls, sparse_cls",
    [
        ("sgd", None, torch.optim.SGD, SparseSGD),
        ("adagrad", None, torch.optim.Adagrad, RowWiseAdagrad),
        ("adam", None, torch.optim.Adam, LazyAdam),
        ("adam", "adagrad", torch.optim.Adam, RowWiseAdagrad),
    ],
)
def test_make_optimizers_splits_dense_and_sparse_parameters(name, embedding_name, dense_cls, sparse_cls):
    model = tiny_model()
    dense_opt, sparse_opt = make_optimizers(model, name, lr=0.5, embedding_name=embedding_name, embedding_lr=0.25)
    assert type(dense_opt) is dense_cls and type(sparse_opt) is sparse_cls
    assert dense_opt.param_groups[0]["lr"] == 0.5 and sparse_opt.param_groups[0]["lr"] == 0.25
    assert dense_opt.param_groups[0]["params"] == model.dense_parameters()
    assert sparse_opt.param_groups[0]["params"] == [model.embeddings.weight]
    assert make_optimizers(model, name, lr=0.5)[1].param_groups[0]["lr"] == 0.5


def test_make_optimizers_rejects_unknown_names():
    with pytest.raises(DistrecError, match="train.optimizer is 'rmsprop'"):
        make_optimizers(tiny_model(), "rmsprop", 0.1)
    with pytest.raises(DistrecError, match="train.embedding_optimizer"):
        make_optimizers(tiny_model(), "sgd", 0.1, embedding_name="lamb")


@pytest.mark.parametrize("optimizer_cls", [SparseSGD, RowWiseAdagrad])
@pytest.mark.parametrize("coalesce", [False, True], ids=["repeated-rows", "distinct-rows"])
def test_one_pass_cpu_update_equals_the_torch_operators(optimizer_cls, coalesce):
    """float32 CPU weights take distrec.kernels.row_updates; float64 the torch operators (the reference)."""
    assert optim.fused_update(nn.Parameter(start_weight().float())) and not optim.fused_update(nn.Parameter(start_weight()))
    grads = [sparse_grad(rows, seed) for seed, rows in enumerate(STEPS)]
    grads = [g.coalesce() if coalesce else g for g in grads]
    reference, reference_opt = run(optimizer_cls, grads, lr=0.3)
    param = nn.Parameter(start_weight().float())
    opt = optimizer_cls([param], lr=0.3)
    for grad in grads:
        param.grad = grad.float()
        opt.step()
    torch.testing.assert_close(param.detach(), reference.detach().float())
    for key, value in reference_opt.state[reference].items():
        torch.testing.assert_close(opt.state[param][key], value.float())


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("max_bag", [1, 4], ids=["single-hot", "multi-hot"])
def test_update_in_backward_equals_backward_then_step(name, max_bag):
    """The same steps, once with the rows updated in backward (no embedding gradient) and once from gradients in step."""
    tables = [TableConfig("a", 9, 4), TableConfig("b", 13, 4)]
    batches = [single_hot_batch(tables, 16, s) if max_bag == 1 else random_batch(tables, 16, 3, max_bag, s) for s in range(3)]
    runs = []
    for in_backward in (False, True):
        torch.manual_seed(0)
        model = build_model(ModelConfig(embedding_dim=4, bottom_mlp=[8], top_mlp=[8]), 3, tables)
        initial = model.embeddings.weight.detach().clone()
        optimizers = make_optimizers(model, name, 0.1)
        optimizers[-1].update_in_backward(in_backward)
        step = TrainStep(model, optimizers)
        for batch in batches:
            step.backward(batch)
            assert (model.embeddings.weight.grad is None) == in_backward
            step.apply()
        runs.append((model.embeddings.weight.detach().clone(), dict(optimizers[-1].state[model.embeddings.weight])))
    (before, state_before), (fused, state_fused) = runs
    assert not torch.equal(before, initial)
    assert torch.equal(fused, before)
    for key, value in state_before.items():
        assert torch.equal(state_fused[key], value)


def test_update_in_backward_leaves_weight_decay_and_other_devices_to_step():
    model = tiny_model()
    sparse = make_optimizers(model, "sgd", 0.1, embedding_weight_decay=0.01)[-1]
    sparse.update_in_backward()
    assert not hasattr(model.embeddings.weight, "update_rows_in_backward")
    adam = make_optimizers(model, "adam", 0.1)[-1]
    adam.update_in_backward()
    assert not hasattr(model.embeddings.weight, "update_rows_in_backward")
    make_optimizers(model, "sgd", 0.1)[-1].update_in_backward()
    assert hasattr(model.embeddings.weight, "update_rows_in_backward")
