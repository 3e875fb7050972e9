"""The threaded row scatter equals a serial index_add_."""

from __future__ import annotations

import pytest
import torch

from distrec.kernels import rows as kernel
from distrec.kernels.rows import add_to_distinct_rows


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
