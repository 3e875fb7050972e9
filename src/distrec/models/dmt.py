"""DMT in one process: the maths DMT computes, without the ranks.

Pooled embeddings ``[B, F, N]`` -> tower t's module on its features -> the towers' outputs
side by side, cut into K vectors of the tower modules' width D (``TowerEmbeddings``). A
DLRM or DCN built with a ``TowerLayout`` takes these K vectors in place of its F pooled
embeddings: DMT-DLRM interacts them with the bottom MLP's output (also of width D) and
feeds the top MLP; DMT-DCN runs its cross and deep networks on them (flattened, next to
the dense features). The distributed form computes the same:
``distrec.parallel.sptt_embedding.SpttTowerEmbeddings`` returns exactly
``TowerEmbeddings``' output for the rank's samples (tested), so these models give the DMT
quality numbers on one process.

Example:
    >>> layout = TowerLayout([[0, 2], [1, 3]], TowerModuleSpec("dlrm", dim=8))
    >>> DLRM(13, tables, bottom_mlp=[64], top_mlp=[64], towers=layout)(batch).shape  # doctest: +SKIP
    torch.Size([B])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from distrec.config import ModelConfig
from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.embedding import EmbeddingBagCollection
from distrec.models.tower_modules import TowerModuleSpec
from distrec.tables import TableConfig


def tower_spec(model_cfg: ModelConfig, tower_sizes: Sequence[int]) -> TowerModuleSpec:
    """The tower-module design ``model_cfg`` asks for, for towers of ``tower_sizes`` features."""
    m = model_cfg
    if m.tower_dim is not None:
        return TowerModuleSpec(m.tower_module, m.tower_dim, m.tower_c, m.tower_p, m.tower_cross_layers, m.tower_interaction)
    return TowerModuleSpec.for_compression(
        m.tower_module, tower_sizes, m.embedding_dim, m.tower_compression, m.tower_c, m.tower_p, m.tower_cross_layers, m.tower_interaction
    )


@dataclass(frozen=True)
class TowerLayout:
    """Which features form each tower and the tower-module design they share.

    Attributes:
        towers: feature indices of each tower (every feature in exactly one tower).
        spec: the tower-module design; ``spec.dim`` is D.
    """

    towers: Sequence[Sequence[int]]
    spec: TowerModuleSpec


class TowerEmbeddings(nn.Module):
    """Embedding bags, then one tower module per tower: ``Batch -> [B, K, D]``.

    Args:
        tables: one table per feature, all of dimension N.
        towers: feature indices of each tower (every feature in exactly one tower).
        spec: the tower-module design; ``spec.dim`` is D.
        device: where to allocate the parameters.
        table_dtype: how the tables' rows are stored (``distrec.table_dtype``).
    """

    def __init__(
        self,
        tables: list[TableConfig],
        towers: Sequence[Sequence[int]],
        spec: TowerModuleSpec,
        device: torch.device | str | None = None,
        table_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        listed = sorted(f for tower in towers for f in tower)
        if listed != list(range(len(tables))) or any(not tower for tower in towers):
            raise DistrecError("towers must place every feature in exactly one non-empty tower; regenerate them with 'distrec partition'")
        self.bags = EmbeddingBagCollection(tables, device=device, dtype=table_dtype)
        self.towers = [list(tower) for tower in towers]
        self.spec = spec
        self.dim = spec.dim
        self.modules_by_tower = nn.ModuleList([spec.build(len(tower), self.bags.dim, device) for tower in self.towers])
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


def pooled_embeddings(
    tables: list[TableConfig], towers: TowerLayout | None, device: torch.device | str | None = None, table_dtype: torch.dtype = torch.float32
) -> EmbeddingBagCollection | TowerEmbeddings:
    """A model's ``embeddings``: one bag per table (``[B, F, N]``), or with ``towers`` the
    towers' outputs (``[B, K, D]``); either has ``num_vectors`` and ``dim``. The rows are
    stored as ``table_dtype`` (see ``distrec.table_dtype``)."""
    if towers is None:
        return EmbeddingBagCollection(tables, device=device, dtype=table_dtype)
    return TowerEmbeddings(tables, towers.towers, towers.spec, device, table_dtype)
