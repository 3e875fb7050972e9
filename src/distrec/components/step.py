"""One training step on a Batch: forward, BCE loss, backward, optimizer and schedule updates."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from distrec.allocator import keep_freed_memory
from distrec.components.breakdown import StepTimer
from distrec.data.batch import Batch


class TrainStep:
    """The per-step work of training, kept small so every trainer shares the fast path.

    Calling it on a batch runs forward, loss, backward, every optimizer, every scheduler,
    and clears the gradients (set to None). It returns the loss as a detached 0-dim
    tensor, so nothing waits for it: call ``float(loss)`` only when logging. ``backward``
    and ``apply`` are the two halves, for callers that time them separately.

    For a mini-batch split into micro-batches (Hotline), call ``backward`` once per part
    with ``normalizer`` = the mini-batch size, then ``apply`` once: the summed losses over
    B give the same gradients as one ``step`` on the whole mini-batch, because gradients of
    successive backward passes accumulate (dense ones add up, sparse ones concatenate).

    Args:
        model: ``model(batch) -> logits`` float32 [B].
        optimizers: stepped in order by ``apply``.
        schedulers: stepped after the optimizers by ``apply``.
        reuse_host_memory: when the model has CPU parameters, call
            ``distrec.allocator.keep_freed_memory()`` (a process-wide malloc setting).
        timer: charges each part of the step to a component (``forward``, ``loss``,
            ``backward``, ``gradient_all_reduce``, ``optimizer``); None times nothing.
        sync_gradients: called between backward and the optimizers (e.g. to all-reduce
            the gradients of replicated tables), timed as ``gradient_all_reduce``.

    Example:
        >>> train_step = TrainStep(model, make_optimizers(model, "sgd", 0.1))
        >>> for batch in batches:
        ...     loss = train_step(batch)
        >>> print(f"last loss {float(loss):.4f}")
    """

    def __init__(
        self,
        model: nn.Module,
        optimizers: list[Optimizer],
        schedulers: Sequence[LRScheduler] = (),
        reuse_host_memory: bool = True,
        timer: StepTimer | None = None,
        sync_gradients: Callable[[], None] | None = None,
    ) -> None:
        self.model = model
        self.optimizers = list(optimizers)
        self.schedulers = list(schedulers)
        self.timer = timer
        self.sync_gradients = sync_gradients
        if reuse_host_memory and any(p.device.type == "cpu" for p in model.parameters()):
            keep_freed_memory()

    def _phase(self, name: str) -> AbstractContextManager:
        return self.timer.phase(name) if self.timer is not None else nullcontext()

    def loss(self, batch: Batch, normalizer: float | None = None) -> torch.Tensor:
        """Binary cross-entropy of the batch's logits: the mean, or the sum / ``normalizer``."""
        with self._phase("forward"):
            logits = self.model(batch)
        with self._phase("loss"):
            if normalizer is None:
                return F.binary_cross_entropy_with_logits(logits, batch.labels)
            return F.binary_cross_entropy_with_logits(logits, batch.labels, reduction="sum") / normalizer

    def backward(self, batch: Batch, normalizer: float | None = None) -> torch.Tensor:
        """Add the gradients of ``loss(batch, normalizer)`` to the parameters; the loss, detached."""
        loss = self.loss(batch, normalizer)
        with self._phase("backward"):
            loss.backward()
        return loss.detach()

    def apply(self) -> None:
        """Synchronise gradients if asked, step every optimizer, then every scheduler, then clear the gradients."""
        if self.sync_gradients is not None:
            with self._phase("gradient_all_reduce"):
                self.sync_gradients()
        with self._phase("optimizer"):
            for opt in self.optimizers:
                opt.step()
            for scheduler in self.schedulers:
                scheduler.step()
            self.zero_grad()

    def zero_grad(self) -> None:
        """Drop all gradients (set to None, so the next backward writes them without a zero fill)."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def __call__(self, batch: Batch, normalizer: float | None = None) -> torch.Tensor:
        """One full training step on ``batch``; returns the loss (see ``loss``), detached."""
        loss = self.backward(batch, normalizer)
        self.apply()
        return loss
