"""LocalEmbeddings: every rank trains its own full tables; only dense gradients are all-reduced."""

from __future__ import annotations

from distrec.config import RunConfig
from distrec.parallel.block_mode import BlockMode
from distrec.parallel.parallelize import embedding_divergence


class LocalEmbeddings(BlockMode):
    """The simple multi-node mode: no all-to-all; each rank's tables see its data shard only,
    so they drift apart (each evaluation reports their ``embedding_divergence``)."""

    name = "local"
    embeddings = "local"

    @classmethod
    def accepts(cls, cfg: RunConfig, world_size: int) -> bool:
        return world_size > 1 and cfg.parallel.embeddings == "local"

    def evaluation_extra(self) -> dict[str, float]:
        return {"embedding_divergence": embedding_divergence(self.model.embeddings)}
