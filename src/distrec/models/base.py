"""What every distrec model shares: a replaceable embedding module and the parameter split."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn


@runtime_checkable
class HoldsTowerModules(Protocol):
    """An embedding module with DMT tower modules (``distrec.models.dmt.TowerEmbeddings`` or its distributed form)."""

    def tower_modules(self) -> dict[int, nn.Module]:
        """The tower modules held here, by tower index."""
        ...


class RecommendationModel(nn.Module):
    """A click model ``model(batch) -> logits`` float32 [B] with an ``embeddings`` submodule.

    ``embeddings`` maps a Batch to pooled vectors [B, K, D]. It is a plain attribute so that
    ``distrec.parallel`` can swap it for a sharded module with the same contract; its
    parameters get sparse gradients and a sparse optimizer, all others a dense one. When it
    holds DMT tower modules (``distrec.models.dmt``), those are kept apart as
    ``tower_parameters``: dense, but synchronised inside a host only when distributed.
    """

    embeddings: nn.Module

    def tower_parameters(self) -> list[nn.Parameter]:
        """Parameters of tower modules (none in a model without towers)."""
        if not isinstance(self.embeddings, HoldsTowerModules):
            return []
        return [p for module in self.embeddings.tower_modules().values() for p in module.parameters()]

    def sparse_parameters(self) -> list[nn.Parameter]:
        """Parameters of the embedding module but its tower modules (sparse gradients)."""
        towers = {id(p) for p in self.tower_parameters()}
        return [p for p in self.embeddings.parameters() if id(p) not in towers]

    def dense_parameters(self) -> list[nn.Parameter]:
        """Every other parameter (MLPs, interaction, cross network)."""
        apart = {id(p) for p in [*self.sparse_parameters(), *self.tower_parameters()]}
        return [p for p in self.parameters() if id(p) not in apart]
