"""Click models (DLRM, DCN-v2) built from fused embedding bags, interactions and MLPs."""

from distrec.models.base import RecommendationModel
from distrec.models.build import build_model
from distrec.models.dcn import DCN
from distrec.models.dlrm import DLRM
from distrec.models.embedding import EmbeddingBagCollection

__all__ = ["DCN", "DLRM", "EmbeddingBagCollection", "RecommendationModel", "build_model"]
