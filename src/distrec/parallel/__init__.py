"""Parallelism applied to a model from the outside: the parallel modes and their parts.

The interface every mode implements, and the fixed order in which one is applied, is
``mode`` (``ParallelMode``, ``parallelize``); the composition root that lists the modes and
picks one is ``distrec.modes``. Paper concept -> module:

- hybrid parallelism (DLRM, Naumov et al. 2019): table-, column-, row-wise and replicated
  shards by a plan -> ``plan``, ``default_plans``, ``sharded_embedding`` (the all-to-all
  lookup), ``sharded`` (the mode); dense layers data-parallel -> ``parallelize``
- each rank keeps its own tables, only dense gradients all-reduced -> ``local``
- the one-process reference -> ``single``; what the table-holding modes share (checkpoint
  blocks, the standard step) -> ``block_mode``
- DMT (Luo et al., MLSys 2024): hosts x ranks-per-host topology and peers -> ``topology``;
  SPTT steps (a)-(f) -> ``sptt``, ``sptt_embedding``; the modes with and without tower
  modules -> ``sptt_mode``; tower modules in checkpoints -> ``tower_state``
- checkpoints that load at any world size and plan -> ``reshard``
- process groups and backends -> ``comm``
"""
