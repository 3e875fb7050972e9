"""Half-precision tables (``model.table_dtype``): unbiased stochastic rounding, float32 sums,
gradients and state, and training in every table placement that stays close to float32 and
resumes exactly (the rounding's counter is checkpointed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distrec.components.checkpoint import load_state
from distrec.components.optim import RowWiseAdagrad, SparseSGD
from distrec.data import prepare
from distrec.data.batch import Batch
from distrec.models.embedding import EmbeddingBagCollection
from distrec.table_dtype import add_to_rows, round_stochastically, rounding_generator
from distrec.tables import TableConfig
from distrec.train.loop import train
from multiprocess import run_distributed
from tiny_runs import assert_same_parameters, tiny_config, train_losses, train_on_rank, trained_parameters

HALVES = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALVES)
def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour(dtype):
    value = 1 + 2**-12 if dtype == torch.float16 else 1 + 2**-9  # a quarter of the way to the next number above 1
    above = torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(2.0, dtype=dtype))
    rounded = round_stochastically(torch.full((200_000,), value), dtype, torch.Generator().manual_seed(0))
    assert rounded.dtype == dtype
    assert set(rounded.float().unique().tolist()) == {1.0, float(above)}
    share_up = float((rounded == above).float().mean())
    assert share_up == pytest.approx(0.25, abs=0.005)  # 4 standard deviations
    assert torch.full((4,), value).to(dtype).eq(1.0).all()  # round to nearest loses the quarter every time


@pytest.mark.parametrize("dtype", HALVES)
def test_representable_values_are_kept_and_the_same_generator_rounds_alike(dtype):
    exact = torch.randn(1000).to(dtype).float()
    assert torch.equal(round_stochastically(exact, dtype, torch.Generator().manual_seed(1)).float(), exact)
    values = torch.randn(1000)
    first = round_stochastically(values, dtype, rounding_generator([3, 0], 7, torch.device("cpu")))
    again = round_stochastically(values, dtype, rounding_generator([3, 0], 7, torch.device("cpu")))
    other = round_stochastically(values, dtype, rounding_generator([3, 0], 8, torch.device("cpu")))
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_updates_far_below_the_spacing_still_move_half_rows_on_average():
    table = torch.ones(2000, 4, dtype=torch.float16)
    rows, step = torch.arange(2000), 2**-14  # an eighth of float16's spacing below 1 (2^-11)
    for counter in range(64):
        add_to_rows(table, rows, torch.full((2000, 4), -step), rounding_generator([0], counter, torch.device("cpu")))
    assert float(table.float().mean()) == pytest.approx(1 - 64 * step, abs=2e-5)  # round to nearest would stay at 1


@pytest.mark.parametrize("dtype", HALVES)
def test_half_tables_pool_into_float32_and_get_float32_gradients_and_state(dtype):
    torch.manual_seed(0)
    tables = [TableConfig("a", 50, 8), TableConfig("b", 30, 8)]
    half, full = EmbeddingBagCollection(tables, dtype=dtype), EmbeddingBagCollection(tables)
    full.weight.data.copy_(half.weight.data.float())
    values = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    batch = Batch(torch.zeros(3, 0), values, torch.tensor([0, 2, 4, 6, 8, 10, 12]), torch.zeros(3))
    pooled, expected = half(batch), full(batch)
    assert half.weight.dtype == dtype and pooled.dtype == torch.float32
    # each bag is summed in float32 and rounded once to the table's dtype
    torch.testing.assert_close(pooled, expected, rtol=2**-7 if dtype == torch.bfloat16 else 2**-10, atol=1e-6)
    pooled.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    assert half.weight.grad.dtype == torch.float32 and half.weight.grad.is_sparse
    torch.testing.assert_close(half.weight.grad.to_dense(), full.weight.grad.to_dense(), rtol=2**-6, atol=1e-6)
    optimizer = RowWiseAdagrad([half.weight], lr=0.1)
    optimizer.step()
    assert optimizer.state[half.weight]["sum"].dtype == torch.float32
    assert optimizer.param_groups[0]["rounding_steps"] == 1


def test_sgd_on_half_rows_equals_float32_sgd_to_the_rounding():
    torch.manual_seed(0)
    start = torch.randn(100, 4).half()
    half, full = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.float())
    half.grad_dtype = torch.float32
    rows = torch.tensor([[3, 3, 7, 50]])  # row 3 twice: its entries add up
    grad = torch.randn(4, 4)
    for p in (half, full):
        p.grad = torch.sparse_coo_tensor(rows, grad, (100, 4))
    SparseSGD([half], lr=0.1).step()
    SparseSGD([full], lr=0.1).step()
    # each updated value is one of the two half numbers around the float32 result
    torch.testing.assert_close(half.float(), full.detach(), rtol=2**-10, atol=2**-24)
    untouched = torch.ones(100, dtype=torch.bool)
    untouched[[3, 7, 50]] = False
    assert torch.equal(half[untouched], start[untouched])


# --- training in every placement ------------------------------------------------------------

STEPS = 6

PLACEMENTS = {
    "single": (1, {}),
    "row-wise": (2, {"sharding": "row_wise"}),
    "column-wise": (2, {"sharding": "column_wise"}),
    "data-parallel": (2, {"sharding": "data_parallel"}),
    "local": (2, {"embeddings": "local"}),
    "sptt-towers": (2, {"lookup": "sptt", "hosts": 2, "ranks_per_host": 1}),
    "2d-exact": (2, {"replica_groups": 2}),
    "2d-periodic": (2, {"replica_groups": 2, "replica_sync": "periodic", "sync_every": 3}),  # a stop at a sync resumes exactly
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cache")
    prepare(tiny_config(path, STEPS).data, progress=False)
    return path


def _config(cache: Path, placement: str, steps: int, dtype: str, optimizer: str = "sgd"):
    _, parallel = PLACEMENTS[placement]
    overrides = [f"model.table_dtype={dtype}", f"train.optimizer={optimizer}", *(["train.lr=0.05"] if optimizer == "adagrad" else [])]
    if placement == "sptt-towers":
        overrides.append("model.tower_module=dlrm")
    return tiny_config(cache, steps, tuple(overrides), **parallel)


def _train(cfg, out: Path, world_size: int, resume: bool = False) -> None:
    if world_size == 1:
        train(cfg, out, resume=resume, progress=False)
    else:
        run_distributed(train_on_rank, world_size, cfg, out, resume)


def _saved_table_dtypes(run: Path) -> set[torch.dtype]:
    meta = json.loads((run / "checkpoint" / "meta.json").read_text())
    dtypes = set()
    for rank in range(meta["world_size"]):
        state = load_state(run / "checkpoint", rank)
        dtypes |= {block["weight"].dtype for block in state["blocks"]}
    return dtypes


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_half_tables_train_close_to_float32_and_resume_exactly(cache, tmp_path, placement):
    world_size, _ = PLACEMENTS[placement]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    _train(_config(cache, placement, STEPS, "fp16"), straight, world_size)
    _train(_config(cache, placement, STEPS // 2, "fp16"), stopped, world_size)
    _train(_config(cache, placement, STEPS, "fp16"), stopped, world_size, resume=True)
    assert _saved_table_dtypes(straight) == {torch.float16}
    # the rounding's counter came back with the checkpoint: the same rows, bit for bit
    assert_same_parameters(trained_parameters(stopped), trained_parameters(straight), atol=0)
    if placement in ("single", "row-wise"):
        reference = tmp_path / "fp32"
        _train(_config(cache, placement, STEPS, "fp32"), reference, world_size)
        assert train_losses(straight) == pytest.approx(train_losses(reference), abs=2e-3)
        as_float = {name: value.float() for name, value in trained_parameters(straight).items()}
        assert_same_parameters(as_float, trained_parameters(reference), atol=5e-3)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_row_wise_adagrad_on_half_tables_follows_float32_training(cache, tmp_path, dtype):
    half, full = tmp_path / dtype, tmp_path / "fp32"
    train(_config(cache, "single", 2 * STEPS, dtype, "adagrad"), half, progress=False)
    train(_config(cache, "single", 2 * STEPS, "fp32", "adagrad"), full, progress=False)
    assert train_losses(half) == pytest.approx(train_losses(full), abs=5e-3 if dtype == "fp16" else 2e-2)
