"""The row kernels: the threaded scatter equals a serial index_add_, the one-pass updates their formulas."""

from __future__ import annotations

import pytest
import torch

from distrec.kernels import rows as kernel
from distrec.kernels.row_updates import rowwise_adagrad_rows, sgd_rows
from distrec.kernels.rows import add_to_distinct_rows
from distrec.models.embedding import group_by_row, sum_by_row


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", [(50, 4), (50,)], ids=["rows", "scalars"])
def test_add_to_distinct_rows_equals_index_add(monkeypatch, threads, shape):
    monkeypatch.setattr(kernel, "MIN_ROWS_PER_THREAD", 2)
    g = torch.Generator().manual_seed(threads)
    weight = torch.randn(*shape, generator=g)
    rows = torch.randperm(shape[0], generator=g)[:31]
    delta = torch.randn(31, *shape[1:], generator=g)
    expected = weight.clone().index_add_(0, rows, delta)
    add_to_distinct_rows(weight, rows, delta, threads=threads)
    assert torch.equal(weight, expected)


def test_add_to_distinct_rows_updates_a_parameter_outside_no_grad(monkeypatch):
    monkeypatch.setattr(kernel, "MIN_ROWS_PER_THREAD", 1)
    param = torch.nn.Parameter(torch.zeros(6, 2))
    add_to_distinct_rows(param, torch.tensor([5, 1, 2]), torch.ones(3, 2), threads=2)
    assert param.detach()[:, 0].tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 1.0]


def _entries(seed: int, num_rows: int = 40, entries: int = 90, dim: int = 8, sources: int = 30):
    """Random gradient entries with repeated rows: rows [entries], source rows [entries], source [sources, dim]."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(num_rows, (entries,), generator=g), torch.randint(sources, (entries,), generator=g), torch.randn(sources, dim, generator=g)


@pytest.mark.parametrize(("seed", "dim"), [(0, 8), (1, 8), (2, 1), (3, 13), (4, 64)])
def test_sgd_rows_equals_summed_gradient_scattered(seed, dim):
    rows, source_of_entry, source = _entries(seed, dim=dim)
    weight = torch.randn(40, dim, generator=torch.Generator().manual_seed(9))
    unique, summed = sum_by_row(rows, source, 40, source_of_entry)
    expected = weight.clone().index_add_(0, unique, summed * -0.3)
    unique, bounds, order = group_by_row(rows, 40)
    sgd_rows(weight, unique, bounds, source_of_entry[order], source, 0.3)
    assert torch.equal(weight, expected)


@pytest.mark.parametrize("dim", [8, 13, 64])
def test_rowwise_adagrad_rows_follows_its_formula(dim):
    rows, source_of_entry, source = _entries(2, dim=dim)
    weight = torch.randn(40, dim, generator=torch.Generator().manual_seed(9))
    accumulator = torch.rand(40)
    unique, summed = sum_by_row(rows, source, 40, source_of_entry)
    expected_sum = accumulator.clone()
    expected_sum[unique] += summed.square().mean(dim=1)
    expected = weight.clone()
    expected[unique] -= 0.3 * summed / (expected_sum[unique].sqrt() + 1e-8).unsqueeze(1)
    unique, bounds, order = group_by_row(rows, 40)
    rowwise_adagrad_rows(weight, accumulator, unique, bounds, source_of_entry[order], source, 0.3, 1e-8)
    torch.testing.assert_close(accumulator, expected_sum)
    torch.testing.assert_close(weight, expected)
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[unique] = False
    assert untouched.any()


def test_row_updates_write_through_column_views():
    """Hotline keeps a row and its state in one stored row: weight and accumulator are column views."""
    stored = torch.zeros(8, 6)
    weight, accumulator = stored[:, :4], stored[:, 4]
    rowwise_adagrad_rows(weight, accumulator, torch.tensor([1, 6]), torch.tensor([0, 1, 3]), torch.tensor([0, 0, 1]), torch.ones(2, 4), 0.5, 0.0)
    assert stored[:, 4].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0]
    assert stored[1, :4].tolist() == [-0.5] * 4 and stored[6, :4].tolist() == [-0.5] * 4
    assert stored[:, 5].abs().sum() == 0
