"""What DMT's tower modules cost and save, next to the same model without them (DMT paper, Tables 4-5)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from distrec.config import ModelConfig
from distrec.data.batch import Batch
from distrec.models.base import RecommendationModel
from distrec.models.build import build_model
from distrec.models.tower_modules import compression_ratio, mflops_per_sample, num_parameters
from distrec.tables import TableConfig


def dmt_cost(model_cfg: ModelConfig, num_dense: int, tables: list[TableConfig], towers: Sequence[Sequence[int]], rows: int = 64) -> dict:
    """The DMT paper's Tables 4-5 columns for a DMT model (DLRM or DCN) and its baseline (the same config without towers).

    Returns ``compression`` (floats per sample crossing hosts without towers / with them),
    ``mflops_per_sample`` (forward, matrix products only, see ``mflops_per_sample``) and
    ``dense_parameters`` (everything but the tables, tower modules included), and the last
    two as ``baseline_*``. Built with one-row stand-in tables, so no table is allocated.
    """
    stand_in = [dataclasses.replace(t, num_rows=1) for t in tables]
    bags = rows * len(tables)
    batch = Batch(torch.zeros(rows, num_dense), torch.zeros(bags, dtype=torch.int64), torch.arange(bags + 1), torch.zeros(rows))
    dmt = build_model(model_cfg, num_dense, stand_in, towers=[list(t) for t in towers])
    baseline = build_model(dataclasses.replace(model_cfg, tower_module=None), num_dense, stand_in)

    def dense_size(model: RecommendationModel) -> int:
        return num_parameters(model) - sum(p.numel() for p in model.sparse_parameters())

    return {
        "tower_module": model_cfg.tower_module,
        "tower_dim": dmt.embeddings.dim,
        "compression": compression_ratio(dmt.embeddings.spec, [len(t) for t in towers], model_cfg.embedding_dim),
        "mflops_per_sample": mflops_per_sample(dmt, batch),
        "dense_parameters": dense_size(dmt),
        "baseline_mflops_per_sample": mflops_per_sample(baseline, batch),
        "baseline_dense_parameters": dense_size(baseline),
    }
