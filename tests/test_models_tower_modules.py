import pytest
import torch

from distrec.config import ModelConfig
from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.build import build_model
from distrec.models.tower_modules import (
    DcnTowerModule,
    DlrmTowerModule,
    TowerModuleSpec,
    compression_ratio,
    mflops_per_sample,
    num_parameters,
)
from distrec.tables import TableConfig

ROWS, F, N = 5, 6, 8


def _embs():
    return torch.randn(ROWS, F, N, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("c,p", [(1, 1), (2, 3), (0, 2), (1, 0)])
def test_dlrm_tower_output_is_d_times_cf_plus_p(c, p):
    module = DlrmTowerModule(F, N, dim=4, c=c, p=p)
    out = module(_embs())
    assert out.shape == (ROWS, 4 * (c * F + p)) and module.output_dim == out.shape[1]
    assert TowerModuleSpec("dlrm", 4, c, p).output_dim(F) == out.shape[1]


def test_dlrm_tower_per_feature_part_projects_each_feature_with_shared_weights():
    module = DlrmTowerModule(F, N, dim=3, c=1, p=1)
    embs = _embs()
    out = module(embs)
    per_feature = out[:, 3:].view(ROWS, F, 3)
    torch.testing.assert_close(per_feature[:, 2], module.project(embs[:, 2]))
    torch.testing.assert_close(out[:, :3], module.mix(embs.reshape(ROWS, F * N)))


def test_dlrm_tower_interaction_mixes_the_towers_pairwise_dot_products_with_the_flat_embeddings():
    module = DlrmTowerModule(F, N, dim=3, c=1, p=2, interaction=True)
    embs = _embs()
    out = module(embs)
    assert out.shape == (ROWS, 3 * (F + 2)) == (ROWS, TowerModuleSpec("dlrm", 3, 1, 2, interaction=True).output_dim(F))
    dots = [embs[:, i] @ embs[:, j].T for i in range(F) for j in range(i + 1, F)]  # [ROWS, ROWS] each
    expected = torch.cat([embs.reshape(ROWS, F * N), torch.stack([d.diagonal() for d in dots], dim=1)], dim=1)
    torch.testing.assert_close(out[:, :6], module.mix(expected))
    assert module.mix.in_features == F * N + F * (F - 1) // 2
    linear = DlrmTowerModule(F, N, dim=3, c=1, p=2)
    assert linear.mix.in_features == F * N and "pair_rows" not in linear.state_dict()  # not in checkpoints


def test_dcn_tower_output_is_f_times_d_and_crossnet_is_the_identity_at_zero_weights():
    module = DcnTowerModule(F, N, dim=2, cross_layers=2)
    assert module(_embs()).shape == (ROWS, F * 2) and module.output_dim == F * 2
    for projection in module.cross.projections:
        torch.nn.init.zeros_(projection.weight)
        torch.nn.init.zeros_(projection.bias)
    x = _embs().flatten(1)
    torch.testing.assert_close(module.cross(x), x)


def test_gradients_flow_to_inputs_and_parameters():
    for module in (DlrmTowerModule(F, N, 4), DcnTowerModule(F, N, 4)):
        embs = _embs().requires_grad_()
        module(embs).square().sum().backward()
        assert embs.grad.abs().sum() > 0
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


@pytest.mark.parametrize("kind", ["dlrm", "dcn"])
@pytest.mark.parametrize("target", [2, 4, 8])
def test_for_compression_reaches_the_target_ratio(kind, target):
    counts, dim = [13, 13], 64
    spec = TowerModuleSpec.for_compression(kind, counts, dim, target)
    ratio = compression_ratio(spec, counts, dim)
    assert abs(ratio - target) / target < 0.1
    module = spec.build(13, dim)
    assert module(torch.zeros(2, 13, dim)).shape == (2, spec.output_dim(13))


def test_compression_ratio_is_input_over_output_floats():
    spec = TowerModuleSpec("dcn", dim=4)
    assert compression_ratio(spec, [3, 5], 16) == pytest.approx(16 / 4)
    spec = TowerModuleSpec("dlrm", dim=2, c=1, p=2)
    assert compression_ratio(spec, [4], 8) == pytest.approx(32 / (2 * (4 + 2)))


def test_mflops_and_parameters_match_the_formulas():
    c, p, d = 2, 3, 4
    module = DlrmTowerModule(F, N, d, c, p)
    flops = 2 * (F * N * p * d) + 2 * (F * N * c * d)
    assert mflops_per_sample(module, _embs()) == pytest.approx(flops / 1e6)
    assert num_parameters(module) == (F * N + 1) * p * d + (N + 1) * c * d
    dcn = DcnTowerModule(F, N, d, cross_layers=2)
    width = F * N
    assert mflops_per_sample(dcn, _embs()) == pytest.approx((2 * 2 * width * width + 2 * width * F * d) / 1e6)
    assert num_parameters(dcn) == 2 * (width + 1) * width + (width + 1) * F * d


def test_mflops_count_the_dot_interaction_that_runs_in_a_compiled_kernel():
    model = build_model(ModelConfig(bottom_mlp=[64], top_mlp=[64], embedding_dim=16), 13, [TableConfig(f"t{i}", 10, 16) for i in range(26)])
    batch = Batch(dense=torch.randn(32, 13), sparse_values=torch.randint(0, 10, (26 * 32,)), sparse_offsets=torch.arange(26 * 32 + 1), labels=torch.zeros(32))
    pairs = 27 * 26 // 2  # dots among the dense vector and 26 embeddings: the top MLP's input beside the dense vector
    dots = 26 * 26 + 26  # as the torch operators form them: the whole e e^T product, then e x
    multiply_adds = 13 * 64 + 64 * 16 + dots * 16 + (pairs + 16) * 64 + 64 * 1
    assert mflops_per_sample(model, batch) == pytest.approx(2 * multiply_adds / 1e6)
    with torch.no_grad():
        assert torch.equal(model(batch), model(batch))  # outside the counter the kernel runs; the same logits as counted


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(kind="mlp", dim=4), "unknown tower module"),
        (dict(kind="dlrm", dim=0), "invalid"),
        (dict(kind="dlrm", dim=4, c=0, p=0), "invalid"),
        (dict(kind="dlrm", dim=4, c=1, p=0, interaction=True), "p >= 1"),
        (dict(kind="dcn", dim=4, interaction=True), "dlrm tower module"),
    ],
)
def test_spec_errors(kwargs, message):
    with pytest.raises(DistrecError, match=message):
        TowerModuleSpec(**kwargs)
