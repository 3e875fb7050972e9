"""Predicted iteration time of hybrid-parallel DLRM training: flat, SPTT and DMT.

Per GPU and iteration (b samples per GPU, N = H x L GPUs, F features of dimension D pooled
table-wise, F / N per GPU, e bytes per float):

- compute: dense forward + backward = 3 x forward FLOPs, at ``peak x efficiency``; DMT adds
  its tower modules (each GPU runs its host's tower on the H x b samples of its peers, which
  is b samples' worth of all towers' FLOPs);
- index exchange (step (a), the same in all schemes): a flat all-to-all of
  ``b x F/N x pooling`` indices per peer;
- embedding exchange, forward and again backward (the gradients):
  flat: one all-to-all of ``b x F/N x D x e`` bytes per peer;
  SPTT: an intra-host all-to-all of ``H b x F/N x D x e`` bytes to each of L - 1 peers,
  then a cross-host one of ``b x F/H x D x e / CR`` bytes to each of H - 1 peers (CR = 1);
  DMT: the same with the tower modules' compression ratio CR;
- dense gradient all-reduce over all GPUs; DMT's tower-module gradients over the host only.

Components add up: the model assumes no overlap of communication and compute, and leaves
out lookups and optimizer steps (the same in every scheme).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from distrec.errors import DistrecError
from distrec.sim.cluster import Cluster
from distrec.sim.collectives import all_reduce_time, all_to_all_time, flat_all_to_all_time, ring_all_reduce_time

SCHEMES = ("flat", "sptt", "dmt")


@dataclass(frozen=True)
class Workload:
    """The model and batch of one training iteration.

    Attributes:
        local_batch: samples per GPU (b).
        num_features: sparse features, one table each (F).
        embedding_dim: floats per pooled embedding (D).
        pooling: mean indices per feature and sample.
        dense_mflops: forward MFLOPs per sample of the dense layers (bottom, interaction, top).
        dense_params: replicated dense parameters, all-reduced every iteration.
        tower_mflops: DMT only: forward MFLOPs per sample of all tower modules together.
        tower_params: DMT only: parameters of one host's tower module.
        bytes_per_float: bytes per exchanged embedding or gradient value.
        bytes_per_index: bytes per sparse index.
    """

    local_batch: int = 1024
    num_features: int = 256
    embedding_dim: int = 128
    pooling: float = 1.0
    dense_mflops: float = 200.0
    dense_params: int = 10_000_000
    tower_mflops: float = 0.0
    tower_params: int = 0
    bytes_per_float: int = 4
    bytes_per_index: int = 8


@dataclass(frozen=True)
class IterationTime:
    """Predicted time of one iteration per component (ms)."""

    compute: float
    index_exchange: float
    embedding_exchange: float
    all_reduce: float

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def predict_iteration(workload: Workload, cluster: Cluster, scheme: str, compression: float = 1.0) -> IterationTime:
    """Predicted iteration time of ``scheme`` ("flat", "sptt" or "dmt" with ``compression``)."""
    if scheme not in SCHEMES:
        raise DistrecError(f"unknown scheme {scheme!r}; choose one of: {', '.join(SCHEMES)}")
    if compression <= 0:
        raise DistrecError(f"compression {compression} must be positive")
    w, c = workload, cluster
    hosts, local, gpus = c.hosts, c.gpus_per_host, c.num_gpus
    features_per_gpu = w.num_features / gpus
    dense_flops = 3 * w.dense_mflops * 1e6 * w.local_batch
    if scheme == "dmt":
        dense_flops += 3 * w.tower_mflops * 1e6 * w.local_batch
    compute = dense_flops / (c.peak_flops * c.compute_efficiency)
    index = flat_all_to_all_time(c, w.local_batch * features_per_gpu * w.pooling * w.bytes_per_index)
    all_reduce = all_reduce_time(c, 4 * w.dense_params)
    if scheme == "flat":
        one_way = flat_all_to_all_time(c, w.local_batch * features_per_gpu * w.embedding_dim * w.bytes_per_float)
    else:
        ratio = compression if scheme == "dmt" else 1.0
        intra_bytes = hosts * w.local_batch * features_per_gpu * w.embedding_dim * w.bytes_per_float
        cross_bytes = w.local_batch * (w.num_features / hosts) * w.embedding_dim * w.bytes_per_float / ratio
        one_way = all_to_all_time(c.scale_up, local - 1, intra_bytes) + all_to_all_time(c.scale_out, hosts - 1, cross_bytes)
        if scheme == "dmt":
            all_reduce += ring_all_reduce_time(c.scale_up, local, 4 * w.tower_params)
    return IterationTime(compute=1e3 * compute, index_exchange=1e3 * index, embedding_exchange=2e3 * one_way, all_reduce=1e3 * all_reduce)


def speedup_table(
    workload: Workload,
    hardware: tuple[str, ...] = ("V100", "A100", "H100"),
    gpu_counts: tuple[int, ...] = (16, 32, 64, 128, 256, 512),
    gpus_per_host: int = 8,
    compression: float = 4.0,
) -> list[dict]:
    """Predicted iteration times (ms) and speedups over flat, by hardware and scale."""
    rows = []
    for name in hardware:
        for gpus in gpu_counts:
            cluster = Cluster.from_hardware(name, gpus, gpus_per_host)
            flat, sptt, dmt = (predict_iteration(workload, cluster, s, compression).total for s in SCHEMES)
            rows.append(
                {
                    "hardware": name,
                    "gpus": gpus,
                    "hosts": cluster.hosts,
                    "flat_ms": flat,
                    "sptt_ms": sptt,
                    "dmt_ms": dmt,
                    "speedup_sptt": flat / sptt,
                    "speedup_dmt": flat / dmt,
                }
            )
    return rows
