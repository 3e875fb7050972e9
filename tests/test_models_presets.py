"""The named presets build the papers' architectures on Criteo-shaped input (13 dense, 26 tables)."""

import pytest
import torch
from torch import nn

from distrec.config import ModelConfig, apply_preset
from distrec.models.build import build_model
from distrec.models.dcn import DCN
from distrec.models.dlrm import DLRM
from distrec.models.interaction import CrossNet
from distrec.tables import TableConfig

NUM_DENSE, NUM_TABLES = 13, 26


def layer_widths(sequential: nn.Sequential) -> list[int]:
    linears = [m for m in sequential if isinstance(m, nn.Linear)]
    return [linears[0].in_features, *(m.out_features for m in linears)]


def build(name: str):
    cfg = ModelConfig()
    apply_preset(cfg, name)
    tables = [TableConfig(f"C{i}", 10 + i, cfg.embedding_dim) for i in range(NUM_TABLES)]
    return build_model(cfg, NUM_DENSE, tables)


# (preset, embedding dim, bottom MLP, top MLP); the top MLP's input is the dense vector plus
# one dot product per pair of the 27 vectors: D + 27 * 26 / 2 = D + 351
@pytest.mark.parametrize(
    "name, dim, bottom, top",
    [
        ("dlrm-kaggle", 16, [13, 512, 256, 64, 16], [16 + 351, 512, 256, 1]),
        ("dlrm-terabyte", 64, [13, 512, 256, 64], [64 + 351, 512, 512, 256, 1]),
        ("dlrm-mlperf", 128, [13, 512, 256, 128], [128 + 351, 1024, 1024, 512, 256, 1]),
        ("tiny", 8, [13, 16, 8, 8], [8 + 351, 16, 1]),
    ],
)
def test_dlrm_presets_match_the_papers(name, dim, bottom, top):
    model = build(name)
    assert isinstance(model, DLRM)
    assert model.embeddings.dim == dim
    assert layer_widths(model.bottom) == bottom
    assert layer_widths(model.top) == top


def test_dcn_preset():
    model = build("dcn")
    assert isinstance(model, DCN) and model.embeddings.dim == 16 and model.structure == "parallel"
    width = NUM_DENSE + NUM_TABLES * 16  # raw dense features beside the pooled embeddings
    assert isinstance(model.cross, CrossNet) and len(model.cross.projections) == 3
    assert all(p.in_features == p.out_features == width for p in model.cross.projections)  # full rank
    assert layer_widths(model.deep) == [width, 512, 256]
    assert model.head.in_features == width + 256


@pytest.mark.parametrize("name", ["dlrm-kaggle", "dlrm-terabyte", "dlrm-mlperf", "dcn", "tiny"])
def test_table_sizes_come_from_the_data(name):
    model = build(name)
    assert [t.num_rows for t in model.embeddings.tables] == [10 + i for i in range(NUM_TABLES)]
    assert model.embeddings.weight.shape == (sum(10 + i for i in range(NUM_TABLES)), model.embeddings.dim)
    assert all(not p.is_sparse for p in model.parameters()) and torch.isfinite(model.embeddings.weight).all()
