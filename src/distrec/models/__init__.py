"""Click models (DLRM, DCN-v2, and their DMT forms) built from fused embedding bags, interactions and
MLPs. Models know nothing of ranks: ``distrec.parallel`` applies parallelism from outside.

Paper concept -> module:

- DLRM (Naumov et al. 2019): embedding bags -> ``embedding`` (``table_init``: DLRM's
  uniform initialisation, block by block); dot/cat interaction -> ``interaction``; MLPs ->
  ``mlp``; the model -> ``dlrm``
- DCN-v2 (Wang et al., WWW 2021): cross network -> ``interaction``; the model -> ``dcn``
- DMT (Luo et al., MLSys 2024): tower modules (DLRM- and DCN-style compression of a tower's
  embeddings) -> ``tower_modules``; the towers' outputs, which DLRM and DCN take in place of
  their pooled embeddings (DMT-DLRM, DMT-DCN) -> ``dmt``; the cost and compression (Tables 4-5)
  -> ``dmt_cost``
- the contract every model shares (replaceable ``embeddings``, parameter groups) -> ``base``;
  building from a config -> ``build``
"""

from distrec.models.base import RecommendationModel
from distrec.models.build import build_model
from distrec.models.dcn import DCN
from distrec.models.dlrm import DLRM
from distrec.models.embedding import EmbeddingBagCollection

__all__ = ["DCN", "DLRM", "EmbeddingBagCollection", "RecommendationModel", "build_model"]
