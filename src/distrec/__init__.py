"""distrec: train large-embedding recommendation models (DLRM, DCN) on one machine or many."""

__version__ = "0.1.0"
