"""Tower modules (DMT, Luo et al., MLSys 2024): dense layers applied to one tower's pooled
embeddings inside its host, so that only their smaller outputs cross hosts.

A tower of F features with embedding dimension N enters as ``[rows, F, N]`` and leaves as
``[rows, out]``:

- DLRM tower: ``o1 = Linear(F*N -> p*D)(flat)`` mixes all the tower's features,
  ``o2 = Linear(N -> c*D)`` projects each feature alone (shared weights), output
  ``cat(o1, o2)`` of width ``D * (c*F + p)``. With ``interaction``, ``o1`` also reads the
  tower's own F(F-1)/2 pairwise dot products (``Linear(F*N + F(F-1)/2 -> p*D)``): the
  interactions inside the tower are formed before compression, the "hierarchical feature
  interaction" of the paper's abstract (a linear ``o1`` cannot form them, so with c = 0
  features that interact gain from being in different towers, not the same one).
- DCN tower: a small CrossNet (``distrec.models.interaction``) on the flat ``F*N`` vector,
  then ``Linear(F*N -> F*D)``.

``compression_ratio`` is how many times fewer floats cross hosts than without towers
(``sum F*N / sum out``; the DESIGN's CR is its reciprocal).

Example:
    >>> spec = TowerModuleSpec.for_compression("dlrm", [13, 13], embedding_dim=16, compression=4)
    >>> spec.dim, round(compression_ratio(spec, [13, 13], 16), 2)
    (4, 3.71)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.interaction import CrossNet

TOWER_KINDS = ("dlrm", "dcn")


class DlrmTowerModule(nn.Module):
    """DLRM tower module: ``cat(Linear(F*N -> p*D)(flat), Linear(N -> c*D)(each feature))``;
    with ``interaction`` the mix also reads the tower's pairwise dot products."""

    def __init__(self, num_features: int, embedding_dim: int, dim: int, c: int = 1, p: int = 1, interaction: bool = False) -> None:
        super().__init__()
        self.num_features, self.embedding_dim = num_features, embedding_dim
        self.output_dim = dim * (c * num_features + p)
        rows, cols = torch.triu_indices(num_features, num_features, offset=1) if interaction else torch.empty(2, 0, dtype=torch.long)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        self.mix = nn.Linear(num_features * embedding_dim + rows.numel(), p * dim) if p > 0 else None
        self.project = nn.Linear(embedding_dim, c * dim) if c > 0 else None

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        """``[rows, F, N]`` -> ``[rows, D*(c*F + p)]``."""
        parts = []
        if self.mix is not None:
            flat = embs.flatten(1)
            if self.pair_rows.numel():
                dots = torch.bmm(embs, embs.transpose(1, 2))[:, self.pair_rows, self.pair_cols]  # [rows, F(F-1)/2]
                flat = torch.cat([flat, dots], dim=1)
            parts.append(self.mix(flat))
        if self.project is not None:
            parts.append(self.project(embs).flatten(1))
        return torch.cat(parts, dim=1)


class DcnTowerModule(nn.Module):
    """DCN tower module: a small CrossNet on the flat ``F*N`` vector, then ``Linear(F*N -> F*D)``."""

    def __init__(self, num_features: int, embedding_dim: int, dim: int, cross_layers: int = 2) -> None:
        super().__init__()
        width = num_features * embedding_dim
        self.output_dim = num_features * dim
        self.cross = CrossNet(width, cross_layers)
        self.project = nn.Linear(width, self.output_dim)

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        """``[rows, F, N]`` -> ``[rows, F*D]``."""
        return self.project(self.cross(embs.flatten(1)))


@dataclass(frozen=True)
class TowerModuleSpec:
    """One tower-module design shared by all towers (each tower builds it for its F).

    Attributes:
        kind: "dlrm" or "dcn".
        dim: D, the width unit of the outputs (floats).
        c: DLRM only: outputs of width D per feature.
        p: DLRM only: outputs of width D mixing all features.
        cross_layers: DCN only: cross layers before the projection.
        interaction: DLRM only: the mixed outputs also read the tower's pairwise dot
            products (needs p >= 1).
    """

    kind: str
    dim: int
    c: int = 1
    p: int = 1
    cross_layers: int = 2
    interaction: bool = False

    def __post_init__(self) -> None:
        if self.kind not in TOWER_KINDS:
            raise DistrecError(f"unknown tower module {self.kind!r}; choose one of: {', '.join(TOWER_KINDS)}")
        if self.dim < 1 or self.c < 0 or self.p < 0 or self.c + self.p == 0 or self.cross_layers < 0:
            raise DistrecError(
                f"tower module dim={self.dim}, c={self.c}, p={self.p}, cross_layers={self.cross_layers} is invalid; "
                "use dim >= 1, c and p >= 0 with c + p >= 1, cross_layers >= 0"
            )
        if self.interaction and (self.kind != "dlrm" or self.p < 1):
            raise DistrecError("the tower interaction feeds the DLRM tower's mixed outputs: use the dlrm tower module with tower p >= 1, or drop it")

    def output_dim(self, num_features: int) -> int:
        """Output width (floats per sample) of a tower of ``num_features`` features."""
        return self.dim * (self.c * num_features + self.p) if self.kind == "dlrm" else num_features * self.dim

    def build(self, num_features: int, embedding_dim: int, device: torch.device | str | None = None) -> nn.Module:
        """The module for a tower of ``num_features`` features of dimension ``embedding_dim``."""
        if self.kind == "dlrm":
            module = DlrmTowerModule(num_features, embedding_dim, self.dim, self.c, self.p, self.interaction)
        else:
            module = DcnTowerModule(num_features, embedding_dim, self.dim, self.cross_layers)
        return module.to(device)

    @classmethod
    def for_compression(
        cls,
        kind: str,
        host_feature_counts: Sequence[int],
        embedding_dim: int,
        compression: float,
        c: int = 1,
        p: int = 1,
        cross_layers: int = 2,
        interaction: bool = False,
    ) -> TowerModuleSpec:
        """The spec whose D comes closest to ``compression`` x fewer floats crossing hosts."""
        if compression <= 0:
            raise DistrecError(f"compression {compression} must be positive (2 means half the bytes cross hosts)")
        features = sum(host_feature_counts)
        if kind == "dlrm":
            units = c * features + p * len(host_feature_counts)
            dim = features * embedding_dim / (compression * max(units, 1))
        else:
            dim = embedding_dim / compression
        return cls(kind, max(1, round(dim)), c, p, cross_layers, interaction)


def compression_ratio(spec: TowerModuleSpec, host_feature_counts: Sequence[int], embedding_dim: int) -> float:
    """Floats per sample crossing hosts without towers / with them (sum F*N / sum out)."""
    inputs = sum(host_feature_counts) * embedding_dim
    return inputs / sum(spec.output_dim(f) for f in host_feature_counts)


def mflops_per_sample(module: nn.Module, example: torch.Tensor | Batch) -> float:
    """Forward MFLOPs per sample of ``module`` on ``example`` (tensor rows or a Batch's samples).

    Counts matrix products (2 FLOPs per multiply-add) with ``torch.utils.flop_counter``, as
    the torch operators form them (the compiled kernels step aside while it counts; DLRM's
    dot interaction counts its whole batched product); element-wise operations (activations,
    the cross layers' products) and embedding lookups are not counted.
    """
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(example)
    rows = example.batch_size if isinstance(example, Batch) else example.shape[0]
    return counter.get_total_flops() / rows / 1e6


def num_parameters(module: nn.Module) -> int:
    """Trainable parameters (floats) of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
