"""LocalEmbeddings: every rank trains its own full tables; only dense gradients are all-reduced."""

from __future__ import annotations

from distrec.models.base import RecommendationModel
from distrec.parallel.block_mode import BlockMode
from distrec.parallel.mode import Telemetry
from distrec.parallel.parallelize import embedding_divergence


class LocalEmbeddings(BlockMode):
    """The simple multi-node mode: no all-to-all; each rank's tables see its data shard only,
    so they drift apart (each evaluation reports their ``embedding_divergence``)."""

    name = "local"
    embeddings = "local"

    def shard_embeddings(self, model: RecommendationModel) -> None:
        """Nothing to shard: every rank keeps the whole tables it built."""

    def telemetry(self) -> list[Telemetry]:
        divergence = Telemetry(evaluation=lambda: {"embedding_divergence": embedding_divergence(self.model.embeddings)})
        return [divergence, *super().telemetry()]
