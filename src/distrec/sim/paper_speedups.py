"""The DMT paper's reported speedups, and the simulator's prediction of each.

Source: Luo et al., "Disaggregated Multi-Tower: Topology-aware Modeling Technique for
Efficient Large Scale Recommendation", MLSys 2024, arXiv 2403.00877v3. A reported point
(``PaperSpeedup``) is DMT's speedup over the flat baseline for a set of settings (hardware
preset x cluster size). The simulator's value for it is the largest ``distrec simulate``
speedup of ``dmt`` over ``flat`` among those settings: for a figure's single bar, that
bar's setting; for a claim like the abstract's "up to 1.9x", every setting it spans. The
relative error is ``|simulated - paper| / paper``.

Only points whose numbers could be read are listed: the stored copy of the paper reachable
here holds only its title, abstract and first lines, so its Fig. 10-12 bars are not in
``PAPER_SPEEDUPS``; add them as ``PaperSpeedup`` rows (one setting each) to compare them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distrec.errors import DistrecError
from distrec.sim.cluster import HARDWARE
from distrec.sim.scaling import scaling_table
from distrec.sim.workload import Workload


@dataclass(frozen=True)
class PaperSpeedup:
    """A DMT speedup over flat that the paper reports.

    Attributes:
        label: what the paper says, short.
        speedup: the reported speedup (x).
        hardware: presets of ``distrec.sim.cluster.HARDWARE`` the number covers.
        gpus: cluster sizes it covers.
        source: where in the paper the number is.
    """

    label: str
    speedup: float
    hardware: tuple[str, ...]
    gpus: tuple[int, ...]
    source: str

    def __post_init__(self) -> None:
        unknown = [h for h in self.hardware if h not in HARDWARE]
        if unknown or not self.hardware or not self.gpus or self.speedup <= 0:
            raise DistrecError(
                f"paper point {self.label!r} needs a speedup > 0, cluster sizes and hardware from {', '.join(HARDWARE)}; "
                f"got speedup {self.speedup}, gpus {self.gpus}, hardware {self.hardware}"
            )


# GPU range: "up to 512 GPUs" (the paper's evaluation scale, as summaries of the paper state it),
# from 2 hosts of 8 on.
PAPER_SPEEDUPS: tuple[PaperSpeedup, ...] = (
    PaperSpeedup(
        label="up to 1.9x across hardware generations",
        speedup=1.9,
        hardware=("V100", "A100", "H100"),
        gpus=(16, 32, 64, 128, 256, 512),
        source="abstract",
    ),
)


def compare_with_paper(
    points: Sequence[PaperSpeedup] = PAPER_SPEEDUPS,
    workload: Workload | None = None,
    compression: float = 4.0,
    gpus_per_host: int = 8,
) -> dict:
    """Each point's paper and simulated speedup and relative error, and the largest error.

    Returns ``{"points": [{label, source, paper, simulated, hardware, gpus, rel_error}],
    "max_rel_error"}``, where ``hardware`` and ``gpus`` name the setting of the simulated value.
    """
    if not points:
        raise DistrecError("no paper points to compare; give at least one PaperSpeedup")
    workload = workload or Workload()
    out = []
    for point in points:
        rows = scaling_table(workload, point.hardware, point.gpus, gpus_per_host, ("flat", "dmt"), compression)
        best = max(rows, key=lambda r: r["speedup_dmt"])
        simulated = best["speedup_dmt"]
        out.append(
            {
                "label": point.label,
                "source": point.source,
                "paper": point.speedup,
                "simulated": simulated,
                "hardware": best["hardware"],
                "gpus": best["gpus"],
                "rel_error": abs(simulated - point.speedup) / point.speedup,
            }
        )
    return {"points": out, "max_rel_error": max(p["rel_error"] for p in out)}
