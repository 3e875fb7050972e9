import pytest
import torch

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.dmt import DmtDLRM, TowerEmbeddings
from distrec.models.tower_modules import TowerModuleSpec
from distrec.tables import TableConfig

TABLES = [TableConfig(f"t{i}", 20, 8) for i in range(5)]
TOWERS = [[3, 0], [4, 1, 2]]


def _batch(rows=6):
    g = torch.Generator().manual_seed(0)
    values = torch.randint(0, 20, (rows * len(TABLES),), generator=g)
    return Batch(torch.randn(rows, 3, generator=g), values, torch.arange(rows * len(TABLES) + 1), torch.zeros(rows))


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


def test_dmt_dlrm_trains_tower_modules_as_dense_parameters():
    torch.manual_seed(0)
    model = DmtDLRM(3, TABLES, TOWERS, TowerModuleSpec("dlrm", dim=4), bottom_mlp=[8], top_mlp=[8])
    batch = _batch()
    assert model(batch).shape == (6,)
    sparse = {id(p) for p in model.sparse_parameters()}
    assert sparse == {id(model.embeddings.bags.weight)}
    assert all(id(p) not in sparse for p in model.embeddings.modules_by_tower.parameters())
    towers = len(model.tower_parameters())
    assert towers == 8 and len(model.dense_parameters()) + towers + 1 == len(list(model.parameters()))


def test_towers_must_cover_every_feature_once():
    with pytest.raises(DistrecError, match="exactly one"):
        TowerEmbeddings(TABLES, [[0, 1], [1, 2, 3, 4]], TowerModuleSpec("dlrm", dim=4))
