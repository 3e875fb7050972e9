import pytest
import torch

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.dcn import DCN
from distrec.models.dlrm import DLRM
from distrec.models.dmt import TowerEmbeddings, TowerLayout
from distrec.models.tower_modules import DcnTowerModule, DlrmTowerModule, TowerModuleSpec
from distrec.tables import TableConfig

TABLES = [TableConfig(f"t{i}", 20, 8) for i in range(5)]
TOWERS = [[3, 0], [4, 1, 2]]

# each architecture with small layers, as DLRM(...) or DCN(...) build it, given towers or not
ARCHS = {
    "dlrm": lambda towers: DLRM(3, TABLES, bottom_mlp=[8], top_mlp=[8], towers=towers),
    "dlrm-cat": lambda towers: DLRM(3, TABLES, bottom_mlp=[8], top_mlp=[8], interaction="cat", towers=towers),
    "dcn": lambda towers: DCN(3, TABLES, cross_layers=2, cross_low_rank=0, structure="parallel", deep_mlp=[8], bottom_mlp=[], towers=towers),
    "dcn-stacked": lambda towers: DCN(3, TABLES, cross_layers=2, cross_low_rank=2, structure="stacked", deep_mlp=[8], bottom_mlp=[4], towers=towers),
}


def _batch(rows=6):
    g = torch.Generator().manual_seed(0)
    values = torch.randint(0, 20, (rows * len(TABLES),), generator=g)
    return Batch(torch.randn(rows, 3, generator=g), values, torch.arange(rows * len(TABLES) + 1), torch.rand(rows, generator=g).round())


def test_tower_embeddings_apply_each_tower_to_its_features_and_cut_vectors_of_width_d():
    torch.manual_seed(0)
    spec = TowerModuleSpec("dlrm", dim=4)
    module = TowerEmbeddings(TABLES, TOWERS, spec)
    batch = _batch()
    out = module(batch)
    # tower of F features gives D * (F + 1) floats: (2 + 1) + (3 + 1) vectors of width 4
    assert out.shape == (6, 7, 4)
    pooled = module.bags(batch)
    expected = torch.cat([m(pooled[:, t]) for m, t in zip(module.modules_by_tower, TOWERS)], dim=1)
    torch.testing.assert_close(out.flatten(1), expected)


SPECS = {
    "dlrm": TowerModuleSpec("dlrm", dim=4),
    "dlrm-interaction": TowerModuleSpec("dlrm", dim=4, c=0, p=2, interaction=True),
    "dcn": TowerModuleSpec("dcn", dim=4),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", SPECS)
def test_dmt_models_train_tower_modules_as_dense_parameters(arch, kind):
    torch.manual_seed(0)
    model = ARCHS[arch](TowerLayout(TOWERS, SPECS[kind]))
    batch = _batch()
    assert model(batch).shape == (6,)
    sparse = {id(p) for p in model.sparse_parameters()}
    assert sparse == {id(model.embeddings.bags.weight)}
    towers = model.tower_parameters()
    assert {id(p) for p in towers} == {id(p) for p in model.embeddings.modules_by_tower.parameters()}
    assert len(model.dense_parameters()) + len(towers) + 1 == len(list(model.parameters()))
    model(batch).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in towers)


def _identity_towers(model: torch.nn.Module) -> None:
    """Make every tower module pass its features through unchanged (D = N)."""
    with torch.no_grad():
        for module in model.embeddings.modules_by_tower:
            if isinstance(module, DcnTowerModule):  # zero cross layers are the identity
                for projection in module.cross.projections:
                    torch.nn.init.zeros_(projection.weight)
                    torch.nn.init.zeros_(projection.bias)
            assert isinstance(module, DcnTowerModule | DlrmTowerModule)
            torch.nn.init.eye_(module.project.weight)
            torch.nn.init.zeros_(module.project.bias)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["dlrm", "dcn"])
def test_dmt_model_with_identity_towers_in_feature_order_is_the_plain_model(arch, kind):
    """DMT changes only what the layers above the embeddings see: with tower modules that
    pass each feature through, in feature order, the DMT model is the model without towers."""
    torch.manual_seed(0)
    plain = ARCHS[arch](None)
    spec = TowerModuleSpec(kind, dim=8, c=1, p=0)  # DLRM tower: per-feature projections only
    dmt = ARCHS[arch](TowerLayout([[0, 1], [2, 3, 4]], spec))
    state = {k.replace("embeddings.", "embeddings.bags.", 1): v for k, v in plain.state_dict().items()}
    missing, unexpected = dmt.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("embeddings.modules_by_tower.") for k in missing)
    _identity_towers(dmt)
    batch = _batch()
    torch.testing.assert_close(dmt(batch), plain(batch))
    plain(batch).square().sum().backward()
    dmt(batch).square().sum().backward()
    torch.testing.assert_close(dmt.embeddings.bags.weight.grad, plain.embeddings.weight.grad)


def test_towers_must_cover_every_feature_once():
    with pytest.raises(DistrecError, match="exactly one"):
        TowerEmbeddings(TABLES, [[0, 1], [1, 2, 3, 4]], TowerModuleSpec("dlrm", dim=4))
