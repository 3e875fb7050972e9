"""Hotline (Adnan et al., "Heterogeneous Acceleration Pipeline for Recommendation System
Training", ISCA 2024): hot embedding rows in a fast tier, the rest in a slow one.

Paper concept -> module:

- access logger (Sec. V-B/C: sampled mini-batches, bounded memory) -> ``access_logger``;
  how well it finds the true top rows -> ``measure``
- hot set within a byte budget, popular vs non-popular inputs, micro-batch split -> ``hot_set``
- the global row ids of every table -> ``rows``; per-row optimizer state -> ``row_state``
- the two tiers (fast: RAM or device; slow: a memory-mapped file or host memory) -> ``tiers``,
  with the slow tier's page readahead -> ``readahead``
- the tiered embedding module and its row optimizer -> ``embedding``, ``optim``
- the pipeline: the popular micro-batch computes while the other's cold rows are gathered,
  hot-set re-learning -> ``pipeline``; CPU placement of the step and the worker -> ``placement``
- one process, as a parallel mode -> ``training`` (the step), ``tiers_mode``
- many processes: hot rows replicated, the rest sharded -> ``replicated``, ``distributed``,
  ``replicated_mode``; each mini-batch's hot lookups, popular samples and touched hot rows ->
  ``hot_lookups``
"""
