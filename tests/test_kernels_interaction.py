"""The compiled dot interaction against the torch operators' path, and its thread split."""

import pytest
import torch

from distrec.kernels import interaction as kernels
from distrec.models import interaction
from distrec.models.interaction import DotInteraction


def outputs_and_grads(module: DotInteraction, dense: torch.Tensor | None, sparse: torch.Tensor, upstream_seed: int = 1):
    inputs = [t.clone().requires_grad_() for t in ([sparse] if dense is None else [dense, sparse])]
    out = module(*(inputs if dense is not None else [None, *inputs]))
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(upstream_seed))
    return out.detach(), torch.autograd.grad((out * upstream).sum(), inputs)


@pytest.mark.parametrize("self_interaction", [False, True])
@pytest.mark.parametrize("has_dense", [False, True])
def test_kernels_equal_the_torch_operators(monkeypatch, self_interaction, has_dense):
    g = torch.Generator().manual_seed(0)
    sparse = torch.randn(37, 6, 16, generator=g)
    dense = torch.randn(37, 16, generator=g) if has_dense else None
    module = DotInteraction(6, has_dense=has_dense, self_interaction=self_interaction)
    assert interaction.interacts_by_kernels(dense, sparse)
    got, got_grads = outputs_and_grads(module, dense, sparse)
    monkeypatch.setattr(interaction, "interacts_by_kernels", lambda x, e: False)
    want, want_grads = outputs_and_grads(module, dense, sparse)
    assert got.shape == want.shape == (37, module.output_width(16))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_non_contiguous_inputs_are_read_as_their_values():
    g = torch.Generator().manual_seed(2)
    sparse = torch.randn(16, 8, 5, generator=g).transpose(1, 2)  # [16, 5, 8], not contiguous
    dense = torch.randn(8, 16, generator=g).t()
    module = DotInteraction(5)
    got, got_grads = outputs_and_grads(module, dense, sparse)
    want, want_grads = outputs_and_grads(module, dense.contiguous(), sparse.contiguous())
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads, strict=True))


def test_results_do_not_depend_on_the_thread_split():
    g = torch.Generator().manual_seed(3)
    batch = 2 * kernels.MIN_SAMPLES_PER_THREAD + 7
    sparse, dense = torch.randn(batch, 4, 32, generator=g), torch.randn(batch, 32, generator=g)
    grad = torch.randn(batch, 32 + 10, generator=g)
    one = kernels.dot_interaction(dense, sparse, False, threads=1)
    two = kernels.dot_interaction(dense, sparse, False, threads=2)
    assert torch.equal(one, two)
    for a, b in zip(
        kernels.dot_interaction_backward(dense, sparse, grad, False, threads=1),
        kernels.dot_interaction_backward(dense, sparse, grad, False, threads=2),
        strict=True,
    ):
        assert torch.equal(a, b)


def test_other_dtypes_use_the_torch_operators():
    sparse = torch.randn(4, 3, 8, dtype=torch.bfloat16)
    assert not interaction.interacts_by_kernels(None, sparse)
    assert not interaction.interacts_by_kernels(torch.randn(4, 8), torch.randn(4, 3, 8, dtype=torch.float64))
    out = DotInteraction(3, has_dense=False)(None, sparse)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 3)
