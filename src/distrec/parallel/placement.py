"""Greedy placement of items (tables or column shards) onto devices under memory limits."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def greedy_place(
    order: Sequence[int],
    sizes: Sequence[int],
    dims: Sequence[int],
    num_devices: int,
    memory_per_device: float,
    add_item: Callable[[int, int], float],
    pins: dict[int, int] | None = None,
    dim_bound: float = math.inf,
) -> tuple[list[int], list[float]] | None:
    """Place items one at a time on the least-loaded device that has room.

    Pinned items go first, to their rank, ignoring ``dim_bound``; then the others in
    ``order``. A device has room for an item if its bytes stay within ``memory_per_device``
    and its summed dimension within ``dim_bound``. Ties go to the device with fewer bytes,
    then the lower rank.

    Args:
        order: item indices, most expensive first.
        sizes: bytes of each item.
        dims: dimension (columns) of each item.
        num_devices: devices to fill.
        memory_per_device: bytes per device.
        add_item: ``add_item(device, item)`` records that ``item`` now sits on ``device``
            and returns the device's new load (a summed cost, or a cost model's prediction).
        pins: item -> rank for items that must go to a given rank.
        dim_bound: the largest summed dimension a device may take.

    Returns:
        (the device of every item, the final load of every device), or None if some item
        fits nowhere.
    """
    pins = pins or {}
    load = [0.0] * num_devices
    used = [0] * num_devices
    dim_sum = [0] * num_devices
    device_of = [-1] * len(sizes)
    everywhere = range(num_devices)
    for item in [i for i in order if i in pins] + [i for i in order if i not in pins]:
        pinned = item in pins
        size, dim = sizes[item], dims[item]
        best, best_key = -1, (math.inf, math.inf)
        for r in (pins[item],) if pinned else everywhere:
            if used[r] + size <= memory_per_device and (pinned or dim_sum[r] + dim <= dim_bound):
                key = (load[r], used[r])
                if key < best_key:
                    best, best_key = r, key
        if best < 0:
            return None
        device_of[item] = best
        used[best] += size
        dim_sum[best] += dim
        load[best] = add_item(best, item)
    return device_of, load
