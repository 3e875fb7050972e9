"""Baseline sharding heuristics (table-wise only), as compared in the NeuroShard paper.

Greedy variants sort tables by a cost, most expensive first, and put each on the device
with the least summed cost that still has memory. The costs follow the NeuroShard baselines:
size (bytes), dim, lookup (dim x pooling factor) and size-lookup (dim x pooling factor x
log10 rows). ``random`` puts each table on a random device that has memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from distrec.errors import DistrecError
from distrec.parallel.placement import greedy_place
from distrec.planner.types import PlanConstraints, TableSpec

GREEDY_COSTS: dict[str, Callable[[TableSpec], float]] = {
    "size-greedy": lambda t: float(t.num_bytes),
    "dim-greedy": lambda t: float(t.dim),
    "lookup-greedy": lambda t: t.dim * t.pooling_factor,
    "size-lookup-greedy": lambda t: t.dim * t.pooling_factor * math.log10(t.num_rows + 1),
}
HEURISTICS = ("random", *GREEDY_COSTS)


def heuristic_placement(
    tables: list[TableSpec],
    num_devices: int,
    memory_per_device: int,
    algorithm: str,
    constraints: PlanConstraints | None = None,
    seed: int = 0,
) -> list[int]:
    """The device of every table under a baseline heuristic (deterministic for a seed).

    Pinned tables go to their rank first. Raises DistrecError if a table fits on no device.
    """
    if algorithm not in HEURISTICS:
        raise DistrecError(f"unknown heuristic {algorithm!r}; choose one of: {', '.join(HEURISTICS)}")
    constraints = constraints or PlanConstraints()
    constraints.check(tables, num_devices)
    index = {t.name: i for i, t in enumerate(tables)}
    pins = {index[name]: rank for name, rank in constraints.pins.items()}
    sizes = [t.num_bytes for t in tables]
    if algorithm == "random":
        device_of = _random_place(sizes, num_devices, memory_per_device, pins, np.random.default_rng(seed))
    else:
        costs = [GREEDY_COSTS[algorithm](t) for t in tables]
        order = sorted(range(len(tables)), key=lambda i: -costs[i])
        loads = [0.0] * num_devices

        def add_item(device: int, item: int) -> float:
            loads[device] += costs[item]
            return loads[device]

        placed = greedy_place(order, sizes, [t.dim for t in tables], num_devices, memory_per_device, add_item, pins)
        device_of = None if placed is None else placed[0]
    if device_of is None:
        raise DistrecError(
            f"{algorithm} found no device with memory for some table ({memory_per_device / 2**20:.1f} MiB each); "
            "use the neuroshard algorithm (it splits columns), more devices or more memory"
        )
    return device_of


def _random_place(sizes: list[int], num_devices: int, memory_per_device: int, pins: dict[int, int], rng: np.random.Generator) -> list[int] | None:
    """Each table (pinned first, the rest in random order) on a random device with room."""
    used = np.zeros(num_devices, dtype=np.int64)
    device_of = [-1] * len(sizes)
    order = [i for i in pins] + [int(i) for i in rng.permutation(len(sizes)) if int(i) not in pins]
    for item in order:
        allowed = [pins[item]] if item in pins else range(num_devices)
        fitting = [r for r in allowed if used[r] + sizes[item] <= memory_per_device]
        if not fitting:
            return None
        device = int(rng.choice(fitting))
        device_of[item] = device
        used[device] += sizes[item]
    return device_of
