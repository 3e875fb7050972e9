"""DLRM (Naumov et al., 2019): bottom MLP, embedding bags, interaction, top MLP."""

from __future__ import annotations

import torch

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.models.dmt import TowerLayout, pooled_embeddings
from distrec.models.interaction import CatInteraction, DotInteraction
from distrec.models.mlp import mlp
from distrec.tables import TableConfig


class DLRM(RecommendationModel):
    """The DLRM click model.

    Dense features go through the bottom MLP ``num_dense -> *bottom_mlp -> D``; each sparse
    feature is pooled from its table into a D-vector; the interaction (pairwise dots with
    the dense vector prepended, or concatenation) feeds the top MLP ``-> *top_mlp -> 1``.
    Without dense features the bottom MLP is left out and only the sparse vectors interact.
    With ``towers`` it is DMT-DLRM (Luo et al., MLSys 2024): the sparse vectors are the K
    tower outputs of width D (``distrec.models.dmt``), and the bottom MLP ends in D.

    Args:
        num_dense: dense features per sample (0 allowed).
        tables: one table per sparse feature, all of dimension D.
        bottom_mlp: hidden widths of the bottom MLP (its last layer has width D).
        top_mlp: hidden widths of the top MLP (its last layer is the logit).
        interaction: ``"dot"`` or ``"cat"``.
        self_interaction: include each vector's dot product with itself.
        device: where to allocate the parameters.
        towers: DMT's towers and tower modules (None: no towers).

    Example:
        >>> model = DLRM(13, tables, bottom_mlp=[512, 256], top_mlp=[512, 256])
        >>> model(batch).shape
        torch.Size([B])
    """

    def __init__(
        self,
        num_dense: int,
        tables: list[TableConfig],
        bottom_mlp: list[int],
        top_mlp: list[int],
        interaction: str = "dot",
        self_interaction: bool = False,
        device: torch.device | str | None = None,
        towers: TowerLayout | None = None,
        table_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.embeddings = pooled_embeddings(tables, towers, device, table_dtype)
        dim, num_vectors = self.embeddings.dim, self.embeddings.num_vectors
        self.bottom = mlp([num_dense, *bottom_mlp, dim], final_activation=True, device=device) if num_dense > 0 else None
        if interaction == "dot":
            self.interaction = DotInteraction(num_vectors, has_dense=num_dense > 0, self_interaction=self_interaction)
            width = self.interaction.output_width(dim)
        elif interaction == "cat":
            self.interaction = CatInteraction()
            width = dim * (num_vectors + int(num_dense > 0))
        else:
            raise DistrecError(f"model.interaction is {interaction!r}; choose dot or cat")
        self.top = mlp([width, *top_mlp, 1], device=device)

    def forward(self, batch: Batch) -> torch.Tensor:
        dense = self.bottom(batch.dense) if self.bottom is not None else None
        return self.top(self.interaction(dense, self.embeddings(batch))).squeeze(1)
