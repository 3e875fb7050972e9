"""What every distrec model shares: a replaceable embedding module and the parameter split."""

from __future__ import annotations

from torch import nn


class RecommendationModel(nn.Module):
    """A click model ``model(batch) -> logits`` float32 [B] with an ``embeddings`` submodule.

    ``embeddings`` maps a Batch to pooled vectors [B, F, D]. It is a plain attribute so that
    ``distrec.parallel`` can swap it for a sharded module with the same contract; its
    parameters get sparse gradients and a sparse optimizer, all others a dense one. A model
    with DMT tower modules (``distrec.models.dmt``) keeps them apart as
    ``tower_parameters``: dense, but synchronised inside a host only when distributed.
    """

    embeddings: nn.Module

    def sparse_parameters(self) -> list[nn.Parameter]:
        """Parameters of the embedding module (sparse gradients)."""
        return list(self.embeddings.parameters())

    def tower_parameters(self) -> list[nn.Parameter]:
        """Parameters of tower modules (none in a model without towers)."""
        return []

    def dense_parameters(self) -> list[nn.Parameter]:
        """Every other parameter (MLPs, interaction, cross network)."""
        apart = {id(p) for p in [*self.sparse_parameters(), *self.tower_parameters()]}
        return [p for p in self.parameters() if id(p) not in apart]
