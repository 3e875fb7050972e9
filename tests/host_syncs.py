"""Counting the host synchronisations of a training step: every call that, on a GPU, makes
the host wait for the device (``Tensor.item``, ``tolist``, ``__bool__``, ``__int__``,
``__float__``, ``nonzero``, ``cpu``, ``numpy``), on the training thread, by call site."""

from __future__ import annotations

import collections
import contextlib
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch

from distrec.train.loop import Trainer

SYNCING = ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero", "cpu", "numpy")
"""Tensor methods that wait for the device when the tensor lives on a GPU."""


@contextlib.contextmanager
def counting_syncs(sites: collections.Counter) -> Iterator[None]:
    """Within the block, count into ``sites`` each call of a ``SYNCING`` method made on the
    calling thread, keyed by (method, the innermost distrec frame 'module:line function')."""
    originals = {name: getattr(torch.Tensor, name) for name in SYNCING}
    thread = threading.current_thread()

    def counted(name: str, method):
        def wrapper(self, *args, **kwargs):
            if threading.current_thread() is thread:
                frames = [f for f in traceback.extract_stack()[:-1] if "/distrec/" in f.filename]
                where = f"{frames[-1].filename.rsplit('/distrec/', 1)[-1]}:{frames[-1].lineno} {frames[-1].name}" if frames else "outside distrec"
                sites[(name, where)] += 1
            return method(self, *args, **kwargs)

        return wrapper

    for name, method in originals.items():
        setattr(torch.Tensor, name, counted(name, method))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def syncs_per_step(trainer: Trainer, warmup: int = 4, steps: int = 2) -> dict[str, float]:
    """The host syncs of ``trainer``'s steady-state steps (after ``warmup`` steps), per step,
    by 'method at site'; the step is the loop's own (``Trainer._step``), logging excluded."""
    batches = trainer.timer.loading(trainer._epoch_batches(), trainer.device)
    for _ in range(warmup):
        trainer._step(next(batches))
    sites: collections.Counter = collections.Counter()
    with counting_syncs(sites):
        for _ in range(steps):
            trainer._step(next(batches))
    return {f"{name} at {where}": n / steps for (name, where), n in sites.items()}


def syncs_on_rank(rank: int, world_size: int, cfg, out: Path) -> dict[str, float]:
    """``syncs_per_step`` of a trainer of ``cfg`` as one rank of a ``run_distributed`` group."""
    trainer = Trainer(cfg, out, progress=False)
    try:
        return syncs_per_step(trainer)
    finally:
        trainer.close()
