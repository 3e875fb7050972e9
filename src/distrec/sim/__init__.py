"""An analytical cluster model that predicts iteration time at scales this machine cannot run.

- hardware and links (hosts, intra-/inter-host bandwidth and latency) -> ``cluster``
- collective costs (flat and hierarchical all-to-all, ring all-reduce) -> ``collectives``
- one training iteration of the flat, DMT and other schemes, speedup tables -> ``iteration``
- link parameters fitted to measured exchanges -> ``calibrate``; tables and plots -> ``report``
"""
