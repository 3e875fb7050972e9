"""An analytical cluster model that predicts iteration time at scales this machine cannot run.

- hardware and links (hosts, intra-/inter-host bandwidth and latency) -> ``cluster``
- the model and batch of one iteration -> ``workload``
- bytes, messages and time of one rank's share of a collective (``Traffic``) -> ``collectives``
- one step's components (index and embedding exchange, replica sync, all-reduce) -> ``components``
- one iteration of flat, SPTT, DMT, 2D and DMT x 2D (``predict``, ``predict_two_d``) -> ``iteration``
- weak scaling over cluster sizes, the fastest 2D replica groups per size -> ``scaling``
- link parameters fitted to measured exchanges -> ``calibrate``; tables and plots -> ``report``
- the DMT paper's reported speedups against the simulated ones -> ``paper_speedups``
"""
