"""The Hotline micro-batch pipeline: popular inputs run at once while cold rows are prefetched.

For each mini-batch of B samples (Adnan et al., ISCA 2024):

1. the access logger may sample it (learning);
2. it is split into a popular micro-batch (every index hot) and a non-popular one;
3. a worker thread starts gathering the non-popular micro-batch's rows, cold ones from the
   slow tier, while the popular micro-batch runs forward and backward on the fast tier
   itself (its indices replaced by fast-tier slots: no gather, no deduplication);
4. the non-popular micro-batch then runs with the prefetched rows.

Each micro-batch's loss is its summed per-sample loss divided by B, so the accumulated
gradients are those of the whole mini-batch's mean loss: the same as ordinary training.
The caller then steps its optimizers once (dense and ``TieredRowOptimizer``). Every
``relearn_every`` mini-batches the hot set is re-selected from the logger's counts, rows
move between tiers, and the logger starts a new window, so drifting popularity is followed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import torch

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.hotline.access_logger import AccessLogger
from distrec.hotline.embedding import EmbeddingLookup, HotlineEmbeddingBagCollection
from distrec.hotline.hot_set import HotSet, is_popular, select_hot_set, split_batch
from distrec.hotline.placement import ThreadPlacement

WORKER_NAME = "hotline-prefetch"

Backward = Callable[[Batch, float], torch.Tensor]  # (micro-batch, normalizer B) -> loss, after backward


log = logging.getLogger(__name__)


@dataclass
class PipelineStats:
    """Counts since training started: mini-batches, samples, popular samples, lookups
    (indices), lookups of hot rows, re-learnings of the hot set, and the seconds the step
    waited for the prefetch worker after the popular micro-batch (cold rows not hidden)."""

    steps: int = 0
    samples: int = 0
    popular_samples: int = 0
    lookups: int = 0
    hot_lookups: int = 0
    relearns: int = 0
    prefetch_wait_seconds: float = 0.0

    @property
    def popular_fraction(self) -> float:
        """Fraction of samples that ran in popular micro-batches."""
        return self.popular_samples / self.samples if self.samples else 0.0

    @property
    def hot_lookup_fraction(self) -> float:
        """Fraction of lookups served by the fast tier."""
        return self.hot_lookups / self.lookups if self.lookups else 0.0

    def record_step(self, samples: int, popular_samples: int, hot: torch.Tensor) -> None:
        """Count one mini-batch: its samples, the popular ones, and its lookups (``hot``: bool
        [lookups], whether each was served by a hot row)."""
        self.steps += 1
        self.samples += samples
        self.popular_samples += popular_samples
        self.lookups += hot.numel()
        self.hot_lookups += int(hot.sum())

    def fractions(self) -> dict[str, float]:
        """The popular and hot-lookup fractions so far."""
        return {"popular_fraction": self.popular_fraction, "hot_lookup_fraction": self.hot_lookup_fraction}

    def summary(self, hot_rows: int, budget_bytes: int) -> dict[str, Any]:
        """The figures a run reports: popular and hot-lookup fractions, re-learnings, and the
        hot set's size (rows) and budget (bytes)."""
        return {
            **self.fractions(),
            "relearns": self.relearns,
            "hot_rows": hot_rows,
            "hot_budget_bytes": budget_bytes,
        }

    def warn_if_never_hot(self, relearn_every: int, sample_rate: float) -> None:
        """Say so when the run ended before its first hot set (Hotline never engaged)."""
        if self.relearns == 0:
            log.warning(
                f"Hotline never engaged: the run ended after {self.steps} steps without a hot set (one is chosen every "
                f"--relearn-every {relearn_every} steps from the mini-batches sampled at --sample-rate {sample_rate}); "
                "lower --relearn-every, raise --sample-rate or train longer"
            )


class HotlinePipeline:
    """Runs mini-batches as popular and non-popular micro-batches, with a prefetch worker.

    Args:
        embeddings: the model's HotlineEmbeddingBagCollection.
        logger: the access logger that samples mini-batches.
        budget_bytes: fast-tier budget of the hot set, in bytes.
        relearn_every: re-select the hot set every this many mini-batches (0: never).
        hot_set: an initial hot set (default: the rows already in the fast tier, at first none).
        placement: CPUs for the step's thread and the prefetch worker (default: the scheduler's choice).

    Example:
        >>> with HotlinePipeline(model.embeddings, AccessLogger(64 << 20), 512 << 20, 1000) as pipe:
        ...     for batch in batches:
        ...         loss = pipe.run(batch, train_step.backward)   # TrainStep.backward(batch, normalizer)
        ...         train_step.apply()
    """

    def __init__(
        self,
        embeddings: HotlineEmbeddingBagCollection,
        logger: AccessLogger,
        budget_bytes: int,
        relearn_every: int,
        hot_set: HotSet | None = None,
        placement: ThreadPlacement | None = None,
    ) -> None:
        if relearn_every < 0:
            raise DistrecError(f"hotline relearn interval is {relearn_every}; give a number of steps >= 0 (0: never)")
        self.embeddings = embeddings
        self.logger = logger
        self.budget_bytes = budget_bytes
        self.relearn_every = relearn_every
        self.stats = PipelineStats()
        self.hot_set = HotSet.from_global_ids(embeddings.hot_ids.cpu().numpy(), embeddings.space, budget_bytes)
        if hot_set is not None:
            self.use_hot_set(hot_set)
        self._sampled_at_relearn = logger.sampled_batches
        self.placement = placement
        pin = placement.pin_prefetch_worker if placement is not None else None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=WORKER_NAME, initializer=pin)

    def run(self, batch: Batch, backward: Backward, normalizer: float | None = None) -> torch.Tensor:
        """Forward and backward one mini-batch as two micro-batches; the loss, detached.

        ``backward(micro_batch, normalizer)`` must add the gradients of the micro-batch's
        summed loss divided by ``normalizer`` (default: the mini-batch size, so the loss is
        the mini-batch's mean) and return that loss.
        On any error the worker is waited for and the looked-up rows' gradients dropped.
        """
        with self.placement.computing() if self.placement is not None else nullcontext():
            return self._run(batch, backward, normalizer)

    def _run(self, batch: Batch, backward: Backward, normalizer: float | None) -> torch.Tensor:
        if self.relearn_every and self.stats.steps and self.stats.steps % self.relearn_every == 0:
            self.relearn()
        size = batch.batch_size
        ids = self.embeddings.space.batch_ids(batch)
        self.logger.observe(ids)
        slots = self.embeddings.store.slots(ids)
        hot = slots >= 0
        mask = is_popular(batch, hot)
        num_popular = int(mask.sum())
        if num_popular == size:
            popular, popular_slots, other, other_ids = batch, slots, None, None
        elif num_popular == 0:
            popular, popular_slots, other, other_ids = None, None, batch, ids
        else:
            popular, positions, other, other_positions = split_batch(batch, mask)
            popular_slots, other_ids = slots[positions], ids[other_positions]
        prefetch: Future[EmbeddingLookup] | None = None
        try:
            if other is not None and popular is not None:
                prefetch = self._worker.submit(self.embeddings.lookup, other, other_ids)
            loss = torch.zeros((), device=batch.labels.device)
            if popular is not None:
                with self.embeddings.prefetched(self.embeddings.hot_lookup(popular, popular_slots)):
                    loss += backward(popular, normalizer or size)
            if other is not None:
                waited = time.perf_counter()
                lookup = prefetch.result() if prefetch is not None else self.embeddings.lookup(other, other_ids)
                self.stats.prefetch_wait_seconds += time.perf_counter() - waited
                with self.embeddings.prefetched(lookup):
                    loss += backward(other, normalizer or size)
        except BaseException:
            if prefetch is not None:
                prefetch.cancel()
                wait([prefetch])
            self.embeddings.clear_gradients()
            raise
        self.stats.record_step(size, num_popular, hot)
        return loss

    def relearn(self) -> HotSet:
        """Select the hot set from the logger's window, move rows, and start a new window.

        A window in which no mini-batch was sampled keeps the current hot set.
        """
        if self.logger.sampled_batches > self._sampled_at_relearn:
            self._select_hot_set()
        self._sampled_at_relearn = self.logger.sampled_batches
        return self.hot_set

    def learn(self, batches: Iterable[Batch]) -> HotSet:
        """A learning phase shortened to ``batches``: count every id of each of them (no
        sampling, no training), then select the hot set from the window's counts at once,
        move rows and start a new window. The batches count as no sampled mini-batch.
        """
        for batch in batches:
            self.logger.record(self.embeddings.space.batch_ids(batch))
        self._select_hot_set()
        self._sampled_at_relearn = self.logger.sampled_batches
        return self.hot_set

    def _select_hot_set(self) -> None:
        ids, counts = self.logger.counts()
        self.use_hot_set(select_hot_set(ids, counts, self.embeddings.space, self.embeddings.hot_row_bytes, self.budget_bytes))
        self.logger.clear()
        self.stats.relearns += 1

    def use_hot_set(self, hot: HotSet) -> None:
        """Move rows between tiers so that exactly the rows of ``hot`` are in the fast tier."""
        self.embeddings.set_hot_set(hot)
        self.hot_set = hot

    def state_dict(self) -> dict:
        """The counters and the position in the learning window (small; the logger's
        entries and the hot rows are saved by their owners)."""
        return {"stats": asdict(self.stats), "sampled_at_relearn": self._sampled_at_relearn}

    def load_state_dict(self, state: dict) -> None:
        self.stats = PipelineStats(**state["stats"])
        self._sampled_at_relearn = int(state["sampled_at_relearn"])

    def close(self) -> None:
        """Stop the worker thread (waiting for a gather in flight)."""
        self._worker.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> HotlinePipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
