"""Fit a link's latency and bandwidth to measured transfer times.

Each measurement is (bytes, ms[, messages]); the model is
``ms = messages x latency + bytes / (bandwidth x efficiency)``. The two unknowns (latency
and the effective bandwidth) are fitted by non-negative least squares on the relative error,
so that small and large transfers count alike. With a nominal bandwidth, the efficiency is
the fitted effective bandwidth over the nominal one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

from distrec.errors import DistrecError
from distrec.sim.cluster import LinkParams


def fit_link(
    num_bytes: Sequence[float],
    ms: Sequence[float],
    messages: Sequence[int] | None = None,
    nominal_bandwidth: float | None = None,
) -> LinkParams:
    """Latency (s), bandwidth (bytes/s) and efficiency that best explain the measurements.

    Args:
        num_bytes: bytes sent by one GPU in each measurement.
        ms: measured time of each (milliseconds).
        messages: messages per measurement (default 1 each).
        nominal_bandwidth: the link's nominal bandwidth; without it the fitted effective
            bandwidth is returned with efficiency 1.
    """
    size = np.asarray(num_bytes, dtype=np.float64)
    time = np.asarray(ms, dtype=np.float64)
    count = np.ones_like(size) if messages is None else np.asarray(messages, dtype=np.float64)
    if not (size.shape == time.shape == count.shape) or size.size < 2 or (time <= 0).any():
        raise DistrecError("link calibration needs at least 2 measurements with matching lengths and times > 0 ms")
    design = np.stack([count, size], axis=1) / time[:, None]
    (latency_ms, ms_per_byte), _ = nnls(design, np.ones_like(time))
    if ms_per_byte <= 0:
        raise DistrecError("measured times do not grow with the bytes sent; measure over a wider range of sizes")
    effective = 1e3 / ms_per_byte
    if nominal_bandwidth is None:
        return LinkParams(latency_s=latency_ms / 1e3, bandwidth=effective)
    return LinkParams(latency_s=latency_ms / 1e3, bandwidth=nominal_bandwidth, efficiency=effective / nominal_bandwidth)
