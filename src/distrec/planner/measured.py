"""Choosing among the search's best plans by timing their devices' lookups on this machine.

The cost models err by about 15% on a device (median), and a search that minimises the
predicted maximum over devices gathers the tables whose costs they under-predict: its plan
is cheaper than a greedy heuristic's by the models and often not on the hardware (see the
README). So the planner times, on the planning device, the compute of every device of a few
candidates (the best plans by predicted cost and the greedy heuristics' plans of the whole
tables) with the micro-benchmark ``collect`` uses for the computation model, and keeps the
candidate whose cost is lowest with the measured compute and the predicted all-to-alls.
This departs from NeuroShard (Zha et al., MLSys 2023), which trusts the models; ``SearchOptions
(measured_plans=0)`` (``--measured-plans 0``) is the paper's planner.

Candidates are timed cheapest predicted first, each device's tables once (timings are cached
by the device's tables), its most expensive predicted device first, and a candidate is
dropped as soon as a timed device alone (its compute and backward all-to-all) costs more
than the best complete candidate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from distrec.allocator import keep_freed_memory
from distrec.planner.cost_models import CostPredictor
from distrec.planner.emit import build_plan, device_tables
from distrec.planner.launch import intra_op_threads
from distrec.planner.search import Placement
from distrec.planner.types import TableSpec
from distrec.planner.workload import THREADS_PER_DEVICE, LookupWorkload, compute_ms, default_device

WARMUP_RUNS = 2
TIMED_RUNS = 5


class DeviceTimer:
    """Times one device's lookups (forward, backward, sparse SGD; ms) as ``collect`` times its
    compute samples: ``THREADS_PER_DEVICE`` threads, the minimum of ``TIMED_RUNS`` runs after
    ``WARMUP_RUNS``; cached by the device's tables.

    Args:
        batch_size: samples per batch (the cost models').
        device: where to run; defaults to the accelerator, else the CPU.
        seed: seed of the weights and index batches.
    """

    def __init__(self, batch_size: int, device: str | torch.device | None = None, seed: int = 0) -> None:
        self.batch_size = batch_size
        self.device = torch.device(device) if device is not None else default_device()
        self.seed = seed
        self._cache: dict[tuple, float] = {}
        keep_freed_memory()  # time the lookups, not the allocator (see distrec.allocator)

    def __call__(self, tables: list[TableSpec]) -> float:
        """Compute time (ms) of a device holding ``tables`` (column shards as tables of their width)."""
        key = tuple(sorted((t.name, t.dim) for t in tables))
        if key not in self._cache:
            with intra_op_threads(THREADS_PER_DEVICE):
                workload = LookupWorkload(tables, self.batch_size, self.device, np.random.default_rng([self.seed, len(self._cache)]))
                self._cache[key] = compute_ms(workload.step, self.device, WARMUP_RUNS, TIMED_RUNS)
        return self._cache[key]


@dataclass
class MeasuredChoice:
    """The candidate kept and how the choice went.

    Attributes:
        index: position of the kept candidate in the list given.
        costs: its per-device costs (ms) with measured compute: compute, bw_comm, fw_comm, total.
        candidates: candidates considered; devices_timed: device compute times asked for.
        seconds: wall time of the timing.
    """

    index: int
    costs: dict[str, np.ndarray]
    candidates: int
    devices_timed: int
    seconds: float

    @property
    def max_cost(self) -> float:
        return float(self.costs["total"].max())


def choose_measured(
    candidates: list[Placement], tables: list[TableSpec], predictor: CostPredictor, timer: Callable[[list[TableSpec]], float]
) -> MeasuredChoice:
    """The candidate of lowest cost with its devices' compute (ms) from ``timer`` (a
    ``DeviceTimer``) and its all-to-alls from ``predictor`` (see the module doc)."""
    start, timed = time.perf_counter(), 0
    best_index, best_costs = -1, None
    for index in sorted(range(len(candidates)), key=lambda i: candidates[i].max_cost):
        placement = candidates[index]
        held = device_tables(build_plan(tables, placement.chunks, placement.device_of, len(placement.costs["total"])), tables)
        compute = np.zeros(len(held))
        bound = best_costs["total"].max() if best_costs is not None else np.inf
        for rank in np.argsort(-placement.costs["compute"], kind="stable"):
            compute[rank] = timer(held[rank]) if held[rank] else 0.0
            timed += bool(held[rank])
            if compute[rank] + placement.costs["bw_comm"][rank] >= bound:
                break
        else:
            dim_sums = np.array([sum(t.dim for t in ts) for ts in held], dtype=np.float64)
            costs = predictor.plan_costs(compute, dim_sums)
            if costs["total"].max() < bound:
                best_index, best_costs = index, costs
    return MeasuredChoice(best_index, best_costs, len(candidates), timed, time.perf_counter() - start)
