"""numba-compiled kernels of the CPU hot path: bag pooling and grouping, row updates, the dot
interaction, the copy of a batch's bags, distributed Hotline's hot lookups.

Import a kernel module through :func:`compiled`, on first use: numba adds about a second to
the start of every process, and most processes (evaluation, planning, other devices) never
need it. Callers choose the torch operators instead while :func:`kernels_hidden` is true.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Literal

from torch.utils._python_dispatch import is_in_torch_dispatch_mode

KernelModule = Literal["bags", "row_updates", "interaction", "jagged", "hot_lookups"]


def compiled(name: KernelModule) -> ModuleType:
    """The kernel module ``distrec.kernels.<name>``, imported (and numba loaded) on the first call."""
    return importlib.import_module(f"{__name__}.{name}")


def kernels_hidden() -> bool:
    """Whether a torch dispatch mode is active (FLOP counting, fake or meta tensors, tracing):
    such a mode must see every operation, and a compiled kernel hides its work from it, so
    the torch operators run instead (the same results)."""
    return is_in_torch_dispatch_mode()
