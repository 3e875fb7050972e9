"""The cluster the simulator predicts for: GPUs in hosts, two kinds of links, peak compute.

Hardware presets (per GPU; bandwidths one direction). The DMT paper (Luo et al.,
"Disaggregated Multi-Tower", MLSys 2024, arXiv 2403.00877, Table 1) compares V100, A100 and
H100 clusters by peak FLOP/s, scale-up (intra-host) and scale-out (cross-host) bandwidth:

- peak FLOP/s: the paper's Table 1 values for V100 (15.7 TFLOP/s, FP32) and A100 (156, TF32
  dense); the table's H100 entry, 989 TFLOP/s, is TF32 with sparsity, so H100 takes the dense
  value of the same precision class from NVIDIA's H100 SXM5 datasheet (495); the bandwidths
  below are the table's (scale-out 100, 200 and 400 Gbit/s; scale-up 150, 300 and 450 GB/s
  one way) and the vendors';
- scale-up: NVLink 2/3/4 per-GPU bandwidth (300, 600, 900 GB/s both directions, NVIDIA
  datasheets), halved to one direction;
- scale-out: one NIC per GPU of 100, 200 (HDR, DGX A100) and 400 Gbit/s (NDR, DGX H100).

Link latencies and efficiencies are assumptions of this model, meant to be replaced by
``distrec.sim.calibrate.fit_link`` on measurements; the compute efficiency is one value for
every preset (not fitted to any result).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, get_args

from distrec.errors import DistrecError

# Per-message latency of one peer-to-peer transfer inside an NCCL-style collective (s).
# Assumed orders of magnitude: NVLink ~5 us, RDMA NIC ~15 us; calibrate for real numbers.
SCALE_UP_LATENCY_S = 5e-6
SCALE_OUT_LATENCY_S = 15e-6
# Fraction of the nominal link bandwidth collectives reach (assumed; calibrate).
LINK_EFFICIENCY = 0.8
# Fraction of peak FLOP/s the dense layers reach, the same for every preset (assumed; recommendation MLPs
# are small GEMMs, far from the large-matrix peak).
COMPUTE_EFFICIENCY = 0.3

# How the cluster's collective library all-reduces (see ``distrec.sim.collectives.all_reduce``).
AllReduceAlgorithm = Literal["auto", "ring", "hierarchical", "tree"]


@dataclass(frozen=True)
class Hardware:
    """One GPU generation: peak compute and per-GPU link bandwidths (one direction)."""

    name: str
    peak_flops: float  # FLOP/s
    scale_up_bandwidth: float  # bytes/s, intra-host
    scale_out_bandwidth: float  # bytes/s, cross-host


HARDWARE: dict[str, Hardware] = {
    "V100": Hardware("V100", peak_flops=15.7e12, scale_up_bandwidth=150e9, scale_out_bandwidth=12.5e9),
    "A100": Hardware("A100", peak_flops=156e12, scale_up_bandwidth=300e9, scale_out_bandwidth=25e9),
    "H100": Hardware("H100", peak_flops=495e12, scale_up_bandwidth=450e9, scale_out_bandwidth=50e9),
}


@dataclass(frozen=True)
class LinkParams:
    """A link class: ``time = messages x latency + bytes / (bandwidth x efficiency)``.

    Attributes:
        latency_s: fixed cost of one message (s).
        bandwidth: nominal bandwidth (bytes/s, one direction).
        efficiency: fraction of the nominal bandwidth reached, in (0, 1].
    """

    latency_s: float
    bandwidth: float
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.bandwidth <= 0 or not 0 < self.efficiency:
            raise DistrecError(
                f"link latency {self.latency_s} s, bandwidth {self.bandwidth} B/s, efficiency {self.efficiency} is "
                "invalid; latency must be >= 0, bandwidth and efficiency > 0"
            )

    def time_s(self, num_bytes: float, messages: int = 1) -> float:
        """Seconds to send ``num_bytes`` in ``messages`` messages over this link."""
        return messages * self.latency_s + num_bytes / (self.bandwidth * self.efficiency)


@dataclass(frozen=True)
class Cluster:
    """``hosts`` hosts of ``gpus_per_host`` GPUs, linked inside hosts by ``scale_up`` and
    across hosts by ``scale_out`` (each GPU's share of both); its collective library
    all-reduces with ``all_reduce_algorithm``. With ``shared_nic`` a host's GPUs share one NIC
    of ``gpus_per_host`` shares (an emulated cluster's one link per host) instead of one NIC
    each: a ring's one flow out of a host then gets the shares of the host's ranks in that ring.
    Every collective also waits ``collective_wait_s`` for its last member to arrive (ranks
    that share cores, stragglers; 0 for the presets), and a periodic sync that merges touched
    rows spends ``row_merge_s`` on each (logging and merging it; 0: not modelled)."""

    hosts: int
    gpus_per_host: int
    peak_flops: float
    compute_efficiency: float
    scale_up: LinkParams
    scale_out: LinkParams
    all_reduce_algorithm: AllReduceAlgorithm = "auto"
    shared_nic: bool = False
    collective_wait_s: float = 0.0
    row_merge_s: float = 0.0

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.gpus_per_host < 1:
            raise DistrecError(f"cluster of {self.hosts} x {self.gpus_per_host} GPUs is invalid; both must be >= 1")
        if self.collective_wait_s < 0 or self.row_merge_s < 0:
            raise DistrecError(f"collective wait {self.collective_wait_s} s or row merge {self.row_merge_s} s is invalid; use 0 or more")
        if self.all_reduce_algorithm not in get_args(AllReduceAlgorithm):
            raise DistrecError(f"unknown all-reduce algorithm {self.all_reduce_algorithm!r}; choose one of: {', '.join(get_args(AllReduceAlgorithm))}")

    @property
    def num_gpus(self) -> int:
        return self.hosts * self.gpus_per_host

    @classmethod
    def from_hardware(
        cls,
        hardware: Hardware | str,
        num_gpus: int,
        gpus_per_host: int = 8,
        compute_efficiency: float = COMPUTE_EFFICIENCY,
        link_efficiency: float = LINK_EFFICIENCY,
    ) -> Cluster:
        """A cluster of ``num_gpus`` GPUs of a preset (or given) hardware generation."""
        if isinstance(hardware, str):
            if hardware not in HARDWARE:
                raise DistrecError(f"unknown hardware {hardware!r}; choose one of: {', '.join(HARDWARE)}")
            hardware = HARDWARE[hardware]
        if num_gpus < 1 or gpus_per_host < 1:
            raise DistrecError(f"a cluster of {num_gpus} GPUs in hosts of {gpus_per_host} is invalid; give positive numbers of GPUs and of GPUs per host")
        if num_gpus % gpus_per_host != 0:
            raise DistrecError(f"{num_gpus} GPUs do not fill hosts of {gpus_per_host}; use a multiple of {gpus_per_host}")
        return cls(
            hosts=num_gpus // gpus_per_host,
            gpus_per_host=gpus_per_host,
            peak_flops=hardware.peak_flops,
            compute_efficiency=compute_efficiency,
            scale_up=LinkParams(SCALE_UP_LATENCY_S, hardware.scale_up_bandwidth, link_efficiency),
            scale_out=LinkParams(SCALE_OUT_LATENCY_S, hardware.scale_out_bandwidth, link_efficiency),
        )

    def replace(self, **changes) -> Cluster:
        """A copy with some fields changed (e.g. calibrated links)."""
        return dataclasses.replace(self, **changes)
