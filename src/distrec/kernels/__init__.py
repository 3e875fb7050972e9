"""numba-compiled kernels of the CPU hot path: bag pooling and grouping, row updates, the dot
interaction, the copy of a batch's bags, distributed Hotline's hot lookups.

Import a kernel module through :func:`compiled`, on first use: numba adds about a second to
the start of every process, and most processes (evaluation, planning, other devices) never
need it. Callers ask :func:`runs_compiled` whether their tensors take a kernel; otherwise the
torch operators compute the same results, which is the path every other device (a GPU) takes.
``DISTREC_KERNELS=torch`` sends CPU tensors down that path too, so the GPU's path is tested
on a machine without one.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Literal

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from distrec.errors import DistrecError

KernelModule = Literal["bags", "row_updates", "interaction", "jagged", "hot_lookups"]
KERNELS_ENV = "DISTREC_KERNELS"
"""The environment variable that chooses the kernels of CPU tensors: ``numba`` (default) or ``torch``."""


def compiled(name: KernelModule) -> ModuleType:
    """The kernel module ``distrec.kernels.<name>``, imported (and numba loaded) on the first call."""
    return importlib.import_module(f"{__name__}.{name}")


def kernels_enabled() -> bool:
    """Whether CPU tensors take the compiled kernels (``DISTREC_KERNELS``: ``numba``, the default, or ``torch``)."""
    chosen = os.environ.get(KERNELS_ENV, "numba")
    if chosen not in ("numba", "torch"):
        raise DistrecError(f"{KERNELS_ENV} is {chosen!r}; set it to numba (compiled CPU kernels) or torch (the operators a GPU runs)")
    return chosen == "numba"


def kernels_hidden() -> bool:
    """Whether a torch dispatch mode is active (FLOP counting, fake or meta tensors, tracing):
    such a mode must see every operation, and a compiled kernel hides its work from it, so
    the torch operators run instead (the same results)."""
    return is_in_torch_dispatch_mode()


def runs_compiled(*tensors: torch.Tensor) -> bool:
    """Whether the compiled kernels take ``tensors``: all on the CPU, the kernels enabled
    (``kernels_enabled``) and no dispatch mode watching (``kernels_hidden``)."""
    return all(t.device.type == "cpu" for t in tensors) and kernels_enabled() and not kernels_hidden()
