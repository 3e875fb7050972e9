"""Build a model from its configuration and the data's shape."""

from __future__ import annotations

import torch

from distrec.config import ModelConfig
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.models.dcn import DCN
from distrec.models.dlrm import DLRM
from distrec.models.dmt import TowerLayout, tower_spec
from distrec.table_dtype import torch_dtype
from distrec.tables import TableConfig


def build_model(
    model_cfg: ModelConfig,
    num_dense: int,
    tables: list[TableConfig],
    device: torch.device | str | None = None,
    towers: list[list[int]] | None = None,
) -> RecommendationModel:
    """The model that ``model_cfg`` describes, for ``num_dense`` dense features and ``tables``.

    Every table must have ``dim == model_cfg.embedding_dim`` (build the tables with it).
    With ``model_cfg.tower_module`` set it is the DMT form of the model (DMT-DLRM, DMT-DCN)
    over ``towers`` (feature indices of each tower, see ``distrec.towers.partition.resolve_towers``).
    Its table rows are stored as ``model_cfg.table_dtype``.

    Example:
        >>> cfg = ModelConfig(); apply_preset(cfg, "tiny")
        >>> build_model(cfg, 13, [TableConfig("c1", 1000, cfg.embedding_dim)])
    """
    for t in tables:
        if t.dim != model_cfg.embedding_dim:
            raise DistrecError(
                f"table {t.name!r} has dim {t.dim} but model.embedding_dim is {model_cfg.embedding_dim}; build the tables with dim=model.embedding_dim"
            )
    layout = None
    if model_cfg.tower_module is not None:
        if towers is None:
            raise DistrecError("a model with tower modules needs towers; pass --towers FILE from 'distrec partition'")
        layout = TowerLayout(towers, tower_spec(model_cfg, [len(t) for t in towers]))
    if model_cfg.arch == "dlrm":
        return DLRM(
            num_dense,
            tables,
            model_cfg.bottom_mlp,
            model_cfg.top_mlp,
            model_cfg.interaction,
            model_cfg.self_interaction,
            device=device,
            towers=layout,
            table_dtype=torch_dtype(model_cfg.table_dtype),
        )
    if model_cfg.arch == "dcn":
        return DCN(
            num_dense,
            tables,
            model_cfg.cross_layers,
            model_cfg.cross_low_rank,
            model_cfg.dcn_structure,
            model_cfg.deep_mlp,
            model_cfg.bottom_mlp,
            device=device,
            towers=layout,
            table_dtype=torch_dtype(model_cfg.table_dtype),
        )
    raise DistrecError(f"model.arch is {model_cfg.arch!r}; choose dlrm or dcn")
