"""DCN-v2 (Wang et al., WWW 2021): a cross network and a deep MLP over embeddings and dense features."""

from __future__ import annotations

import torch
from torch import nn

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.models.dmt import TowerLayout, pooled_embeddings
from distrec.models.interaction import CrossNet
from distrec.models.mlp import mlp
from distrec.tables import TableConfig


class DCN(RecommendationModel):
    """The DCN-v2 click model.

    The input x0 concatenates the dense features (raw, or through a bottom MLP
    ``num_dense -> *bottom_mlp -> D`` when ``bottom_mlp`` is not empty) with the F pooled
    embeddings. ``"parallel"``: CrossNet(x0) and DeepMLP(x0) side by side, concatenated;
    ``"stacked"``: DeepMLP(CrossNet(x0)). A final linear layer gives the logit. With
    ``towers`` it is DMT-DCN (Luo et al., MLSys 2024): x0 holds the K tower outputs of width
    D (``distrec.models.dmt``) instead of the F pooled embeddings, and the bottom MLP ends in D.

    Args:
        num_dense: dense features per sample (0 allowed).
        tables: one table per sparse feature, all of dimension D.
        cross_layers: layers of the cross network.
        cross_low_rank: rank of each cross layer's matrix (0 = full rank).
        structure: ``"parallel"`` or ``"stacked"``.
        deep_mlp: hidden widths of the deep network (ReLU after each).
        bottom_mlp: hidden widths of an optional dense-feature MLP ([] = raw features).
        device: where to allocate the parameters.
        towers: DMT's towers and tower modules (None: no towers).

    Example:
        >>> DCN(13, tables, cross_layers=3, cross_low_rank=0, structure="parallel", deep_mlp=[512, 256])(batch).shape
        torch.Size([B])
    """

    def __init__(
        self,
        num_dense: int,
        tables: list[TableConfig],
        cross_layers: int,
        cross_low_rank: int,
        structure: str,
        deep_mlp: list[int],
        bottom_mlp: list[int],
        device: torch.device | str | None = None,
        towers: TowerLayout | None = None,
        table_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if structure not in ("parallel", "stacked"):
            raise DistrecError(f"model.dcn_structure is {structure!r}; choose parallel or stacked")
        self.embeddings = pooled_embeddings(tables, towers, device, table_dtype)
        dim = self.embeddings.dim
        use_bottom = bool(bottom_mlp) and num_dense > 0
        self.bottom = mlp([num_dense, *bottom_mlp, dim], final_activation=True, device=device) if use_bottom else None
        width = (dim if use_bottom else num_dense) + self.embeddings.num_vectors * dim
        self.structure = structure
        self.cross = CrossNet(width, cross_layers, cross_low_rank, device=device)
        self.deep = mlp([width, *deep_mlp], final_activation=True, device=device)
        deep_width = deep_mlp[-1] if deep_mlp else width
        self.head = nn.Linear(width + deep_width if structure == "parallel" else deep_width, 1, device=device)

    def forward(self, batch: Batch) -> torch.Tensor:
        dense = self.bottom(batch.dense) if self.bottom is not None else batch.dense
        x0 = torch.cat([dense, self.embeddings(batch).flatten(1)], dim=1)
        if self.structure == "parallel":
            features = torch.cat([self.cross(x0), self.deep(x0)], dim=1)
        else:
            features = self.deep(self.cross(x0))
        return self.head(features).squeeze(1)
