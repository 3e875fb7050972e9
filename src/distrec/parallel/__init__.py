"""Parallelism applied to a model from the outside: the parallel axes and their components.

A run's parallelism is a ``spec`` (``ParallelSpec``: replica groups x placement x tower
modules, validated once); the interface every placement implements, the ``Axis`` hooks and
the fixed order in which they apply is ``mode`` (``ParallelMode``, ``parallelize``); the
composition root that maps axis values to components is ``distrec.modes``. Paper concept ->
module:

- hybrid parallelism (DLRM, Naumov et al. 2019): table-, column-, row-wise and replicated
  shards by a plan -> ``plan``, ``default_plans``, ``placement``, ``sharded_embedding`` (the
  all-to-all lookup), ``sharded`` (the mode); dense layers data-parallel -> ``parallelize``
- each rank keeps its own tables, only dense gradients all-reduced -> ``local``
- the one-process reference -> ``single``; what the modes with ordinary table parameters
  share (the axes' hooks, the block checkpoint format) -> ``block_mode``
- DMT (Luo et al., MLSys 2024): hosts x ranks-per-host topology and peers -> ``topology``;
  SPTT steps (a)-(f) -> ``sptt``, ``sptt_embedding``; the mode, with or without tower
  modules -> ``sptt_mode``; tower modules in checkpoints -> ``tower_state``
- 2D sparse parallelism (Zhang et al. 2025): the replica-groups axis -> ``two_d``
- checkpoints that load at any world size and plan -> ``reshard``
- process groups and backends -> ``comm``
"""
