"""DMT's tower partitioner (Luo et al., MLSys 2024, Sec. 3.2): which features share a tower.

Paper concept -> module:

- feature interaction from a trained model (the paper's mean cosine, and a pairwise measure
  that finds factorisation-machine groups) -> ``from_run``
- coordinates by MDS-style embedding, constrained k-means into towers, the strided baseline,
  partitions as JSON -> ``partition``

The tower modules themselves are model code (``distrec.models.tower_modules``,
``distrec.models.dmt``); running towers over hosts is a parallel mode
(``distrec.parallel.sptt_mode``).
"""
