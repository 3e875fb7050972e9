"""numba-compiled kernels of the CPU hot path: bag pooling and grouping, row updates, the dot
interaction, the copy of a batch's bags, distributed Hotline's hot lookups.

Import a kernel module through :func:`compiled`, on first use: numba adds about a second to
the start of every process, and most processes (evaluation, planning, other devices) never
need it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Literal

KernelModule = Literal["bags", "row_updates", "interaction", "jagged", "hot_lookups"]


def compiled(name: KernelModule) -> ModuleType:
    """The kernel module ``distrec.kernels.<name>``, imported (and numba loaded) on the first call."""
    return importlib.import_module(f"{__name__}.{name}")
