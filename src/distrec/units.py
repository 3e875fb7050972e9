"""Human-readable sizes: '512MB', '1.5GiB', '4096' (bytes)."""

from __future__ import annotations

import re

from distrec.errors import DistrecError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int, what: str = "size") -> int:
    """Bytes in a size such as '512MB' (10^6), '1.5GiB' (2^30), '4G' (2^30) or '4096'."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise DistrecError(f"{what} {text!r} is not a size; write it like 512MB, 1.5GiB or 4096 (bytes)")
    return int(float(m.group(1)) * _UNITS[unit])
