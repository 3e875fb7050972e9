"""Weak scaling: each scheme's predicted iteration from the smallest cluster to the largest.

Weak scaling keeps the batch per GPU fixed, so a GPU's throughput is ``b / iteration time``
and the weak-scaling efficiency of a scheme at N GPUs is its per-GPU throughput there over
its own at the smallest size in the table: ``E(N) = T(N_min) / T(N)`` (1 at N_min; 0.9
means each GPU trains 10% fewer samples per second than in the smallest cluster). The 2D
schemes use, at every size, the number of replica groups G that predicts the shortest
iteration (or a fixed G).
"""

from __future__ import annotations

from collections.abc import Sequence

from distrec.errors import DistrecError
from distrec.sim.cluster import Cluster
from distrec.sim.components import Layout, ReplicaSync
from distrec.sim.iteration import SCHEMES, TWO_D_SCHEMES, Prediction, Scheme, predict
from distrec.sim.workload import Workload


def group_choices(cluster: Cluster, scheme: Scheme, layout: Layout = "contiguous") -> list[int]:
    """The numbers of replica groups ``scheme`` can use on ``cluster`` (1 for non-2D schemes).

    Contiguous groups of S ranks need S to divide the GPUs per host or be a multiple of
    them, strided ones the same of G; DMT x 2D needs contiguous groups of whole hosts (and
    ignores ``layout``).
    """
    if scheme not in TWO_D_SCHEMES:
        return [1]
    n, local = cluster.num_gpus, cluster.gpus_per_host
    counts = [g for g in range(1, n + 1) if n % g == 0]
    if scheme == "dmt-2d":
        return [g for g in counts if (n // g) % local == 0]
    tiling = [g if layout == "strided" else n // g for g in counts]  # G or S must tile a host
    return [g for g, t in zip(counts, tiling) if t % local == 0 or local % t == 0]


def best_prediction(
    workload: Workload,
    cluster: Cluster,
    scheme: Scheme,
    compression: float = 1.0,
    sync: ReplicaSync = "periodic",
    sync_every: int = 1,
    groups: int | None = None,
    layout: Layout = "contiguous",
) -> Prediction:
    """``scheme``'s prediction with ``groups`` replica groups, or with the G that predicts the
    shortest iteration (the fewest groups among equals)."""
    choices = group_choices(cluster, scheme, layout) if groups is None or scheme not in TWO_D_SCHEMES else [groups]
    predictions = [predict(workload, cluster, scheme, groups=g, compression=compression, sync=sync, sync_every=sync_every, layout=layout) for g in choices]
    return min(predictions, key=lambda p: (p.total_ms, p.groups))


def scaling_table(
    workload: Workload,
    hardware: Sequence[str] = ("V100", "A100", "H100"),
    gpu_counts: Sequence[int] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    gpus_per_host: int = 8,
    schemes: Sequence[Scheme] = SCHEMES,
    compression: float = 4.0,
    sync: ReplicaSync = "periodic",
    sync_every: int = 10,
    groups: int | None = None,
    layout: Layout = "contiguous",
) -> list[dict]:
    """One row per (hardware, GPUs): each scheme's ms per iteration (``<scheme>_ms``), the G of
    2D schemes (``<scheme>_groups``), the speedup over flat (``speedup_<scheme>``) and the
    weak-scaling efficiency (``efficiency_<scheme>``). ``layout`` applies to 2D; DMT x 2D's
    groups are always contiguous hosts."""
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown or not schemes:
        raise DistrecError(f"unknown scheme(s) {', '.join(unknown) or '(none given)'}; choose from: {', '.join(SCHEMES)}")
    rows = []
    for name in hardware:
        first: dict[str, float] = {}
        for gpus in sorted(gpu_counts):
            cluster = Cluster.from_hardware(name, gpus, gpus_per_host)
            row: dict = {"hardware": name, "gpus": gpus, "hosts": cluster.hosts}
            for scheme in schemes:
                p = best_prediction(workload, cluster, scheme, compression, sync, sync_every, groups, layout if scheme == "2d" else "contiguous")
                row[f"{scheme}_ms"] = p.total_ms
                if scheme in TWO_D_SCHEMES:
                    row[f"{scheme}_groups"] = p.groups
            for scheme in schemes:
                if scheme != "flat" and "flat" in schemes:
                    row[f"speedup_{scheme}"] = row["flat_ms"] / row[f"{scheme}_ms"]
            for scheme in schemes:
                first.setdefault(scheme, row[f"{scheme}_ms"])
                row[f"efficiency_{scheme}"] = first[scheme] / row[f"{scheme}_ms"]
            rows.append(row)
    return rows


def weak_scaling_efficiency(rows: Sequence[dict], schemes: Sequence[Scheme]) -> dict[str, dict[str, dict[str, float]]]:
    """``{hardware: {scheme: {gpus: efficiency}}}`` from ``scaling_table`` rows (gpus as strings, for JSON)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for row in rows:
        for scheme in schemes:
            out.setdefault(row["hardware"], {}).setdefault(scheme, {})[str(row["gpus"])] = row[f"efficiency_{scheme}"]
    return out
