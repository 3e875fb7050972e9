"""DMT-DLRM in one process: the maths DMT computes, without the ranks.

Pooled embeddings ``[B, F, N]`` -> tower t's module on its features -> the towers' outputs
side by side, cut into vectors of the tower modules' width D -> DLRM's dot interaction with
the bottom MLP's output (also of width D) -> top MLP. The distributed form computes the
same: ``distrec.parallel.sptt_embedding.SpttEmbeddingBagCollection`` with a tower module
returns exactly ``TowerEmbeddings``' output for the rank's samples (tested), so this module
gives the DMT-DLRM quality numbers on one process.

Example:
    >>> spec = TowerModuleSpec("dlrm", dim=8)
    >>> model = DmtDLRM(13, tables, [[0, 2], [1, 3]], spec, bottom_mlp=[64], top_mlp=[64])  # doctest: +SKIP
    >>> model(batch).shape                                                                  # doctest: +SKIP
    torch.Size([B])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from distrec.config import ModelConfig
from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.models.embedding import EmbeddingBagCollection
from distrec.models.interaction import DotInteraction
from distrec.models.mlp import mlp
from distrec.models.tower_modules import TowerModuleSpec
from distrec.tables import TableConfig


def tower_spec(model_cfg: ModelConfig, tower_sizes: Sequence[int]) -> TowerModuleSpec:
    """The tower-module design ``model_cfg`` asks for, for towers of ``tower_sizes`` features."""
    m = model_cfg
    if m.tower_dim is not None:
        return TowerModuleSpec(m.tower_module, m.tower_dim, m.tower_c, m.tower_p, m.tower_cross_layers)
    return TowerModuleSpec.for_compression(m.tower_module, tower_sizes, m.embedding_dim, m.tower_compression, m.tower_c, m.tower_p, m.tower_cross_layers)


class TowerEmbeddings(nn.Module):
    """Embedding bags, then one tower module per tower: ``Batch -> [B, K, D]``.

    Args:
        tables: one table per feature, all of dimension N.
        towers: feature indices of each tower (every feature in exactly one tower).
        spec: the tower-module design; ``spec.dim`` is D.
    """

    def __init__(self, tables: list[TableConfig], towers: Sequence[Sequence[int]], spec: TowerModuleSpec) -> None:
        super().__init__()
        listed = sorted(f for tower in towers for f in tower)
        if listed != list(range(len(tables))) or any(not tower for tower in towers):
            raise DistrecError("towers must place every feature in exactly one non-empty tower; regenerate them with 'distrec partition'")
        self.bags = EmbeddingBagCollection(tables)
        self.towers = [list(tower) for tower in towers]
        self.spec = spec
        self.dim = spec.dim
        self.modules_by_tower = nn.ModuleList([spec.build(len(tower), self.bags.dim) for tower in self.towers])
        self.num_vectors = sum(self.tower_dims) // spec.dim

    @property
    def tower_dims(self) -> list[int]:
        """Output width (floats per sample) of each tower's module."""
        return [self.spec.output_dim(len(tower)) for tower in self.towers]

    def tower_modules(self) -> dict[int, nn.Module]:
        """The tower modules held here, by tower index (all of them)."""
        return dict(enumerate(self.modules_by_tower))

    def forward(self, batch: Batch) -> torch.Tensor:
        pooled = self.bags(batch)
        outs = [module(pooled[:, tower]) for module, tower in zip(self.modules_by_tower, self.towers)]
        return torch.cat(outs, dim=1).view(batch.batch_size, self.num_vectors, self.dim)


class DmtDLRM(RecommendationModel):
    """DLRM whose sparse vectors are the towers' outputs (DMT, Luo et al., MLSys 2024).

    Only the tables get sparse gradients; the tower modules are dense parameters, kept
    apart as ``tower_parameters`` (when distributed, synchronised inside their host only).
    ``embeddings`` is a ``TowerEmbeddings`` or, distributed, an ``SpttTowerEmbeddings``;
    both expose ``tower_modules()``.
    """

    def __init__(
        self,
        num_dense: int,
        tables: list[TableConfig],
        towers: Sequence[Sequence[int]],
        spec: TowerModuleSpec,
        bottom_mlp: list[int],
        top_mlp: list[int],
        self_interaction: bool = False,
    ) -> None:
        super().__init__()
        self.embeddings = TowerEmbeddings(tables, towers, spec)
        dim = spec.dim
        self.bottom = mlp([num_dense, *bottom_mlp, dim], final_activation=True) if num_dense > 0 else None
        self.interaction = DotInteraction(self.embeddings.num_vectors, has_dense=num_dense > 0, self_interaction=self_interaction)
        self.top = mlp([self.interaction.output_width(dim), *top_mlp, 1])

    def tower_parameters(self) -> list[nn.Parameter]:
        return [p for module in self.embeddings.tower_modules().values() for p in module.parameters()]

    def sparse_parameters(self) -> list[nn.Parameter]:
        towers = {id(p) for p in self.tower_parameters()}
        return [p for p in self.embeddings.parameters() if id(p) not in towers]

    def forward(self, batch: Batch) -> torch.Tensor:
        dense = self.bottom(batch.dense) if self.bottom is not None else None
        return self.top(self.interaction(dense, self.embeddings(batch))).squeeze(1)
