"""HotlineTraining: a model's training step with its embedding rows in two tiers.

Turns a built model (``distrec.models.build.build_model``, whose ``embeddings`` is an
EmbeddingBagCollection) and a run's configuration into the contract of
``distrec.components.step.TrainStep``: ``step(batch) -> loss`` runs one mini-batch through the
Hotline pipeline (popular micro-batch from the fast tier while the non-popular one's cold
rows are prefetched), then the dense optimizer, the tiered row optimizer and the
learning-rate schedulers.

Training has the two phases of the paper: until the first re-learning (after
``hotline.relearn_every`` mini-batches) nothing is hot and every lookup reads the slow
tier while the access logger samples mini-batches (learning); from then on the hot set is
in the fast tier (acceleration), re-selected every ``relearn_every`` mini-batches.

Checkpoints: ``state_dict()`` holds the small state (dense model, optimizers, schedulers,
pipeline counters); ``save(directory)`` writes the rows of both tiers, the hot set and the
logger's entries as files, since tables may be larger than memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from distrec.components.breakdown import StepTimer
from distrec.components.optimization import Optimization
from distrec.components.step import TrainStep
from distrec.config import RunConfig, embedding_optimizer
from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.hotline.access_logger import DEFAULT_LOGGER_BYTES, AccessLogger
from distrec.hotline.embedding import HotlineEmbeddingBagCollection, stacked_rows_init
from distrec.hotline.hot_set import HotSet
from distrec.hotline.optim import TieredRowOptimizer
from distrec.hotline.pipeline import HotlinePipeline
from distrec.hotline.placement import ThreadPlacement
from distrec.hotline.row_files import BASE_FILE, SavedRows
from distrec.hotline.row_state import RowLayout
from distrec.io import atomic_path
from distrec.models.embedding import EmbeddingBagCollection
from distrec.tables import TableConfig
from distrec.units import parse_bytes

log = logging.getLogger(__name__)

HOT_IDS_FILE = "hotline-hot-ids.npy"  # int64 ascending global ids of the fast tier's rows
LOGGER_FILE = "hotline-logger.npz"


def load_into_model(model: nn.Module, directory: str | Path, state: dict[str, Any], tables: list[TableConfig]) -> None:
    """Fill an ordinary model (``build_model``, maybe with ``stand_in_tables(tables)``) from a
    Hotline checkpoint: ``state`` is ``HotlineTraining.state_dict()``, ``directory`` holds the
    files of ``save``, ``tables`` are the run's. The model's embeddings become an
    EmbeddingBagCollection of ``tables`` over the saved rows memory-mapped
    (``SavedRows.mapped``), so tables larger than RAM evaluate without being read whole; their
    weights keep the dtype they were stored in (the model's table dtype)."""
    if not (Path(directory) / BASE_FILE).is_file():
        raise DistrecError(f"{str(directory)!r} has no {BASE_FILE}; pass a checkpoint of a run trained with --hotline")
    model.load_state_dict(state["model"], strict=False)
    weight = model.embeddings.weight
    layout = RowLayout(model.embeddings.dim, 0, weight.dtype)  # the weights lead every stored row, whatever the state
    rows = SavedRows(directory, layout.numpy_unit).mapped(layout.dim)  # the collection checks that they fit ``tables``
    model.embeddings = EmbeddingBagCollection(tables, weight.device, weight=layout.weights(torch.from_numpy(rows)))


def read_hot_ids(path: Path, total_rows: int) -> np.ndarray:
    """The global ids of the fast tier's rows saved in ``path`` (``HOT_IDS_FILE``), int64 [n]:
    DistrecError unless they are ascending unique ids below ``total_rows``. An array of Python
    objects is refused, never unpickled."""
    try:
        ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        problem = "holds Python objects, which loading would run as code" if "allow_pickle" in str(e) else f"is unreadable ({e})"
    else:
        if ids.dtype != np.int64 or ids.ndim != 1:
            problem = f"holds {ids.dtype} of shape {ids.shape}, not int64 row ids"
        elif ids.size and (ids[0] < 0 or ids[-1] >= total_rows or bool(np.any(np.diff(ids) <= 0))):
            problem = f"holds ids that are not ascending unique rows below {total_rows}"
        else:
            return ids
    raise DistrecError(f"the hot set file {str(path)!r} {problem}; resume from another checkpoint or retrain")


class HotlineTraining:
    """The training step of a model whose embeddings Hotline keeps in a fast and a slow tier.

    Args:
        model: a RecommendationModel whose ``embeddings`` is an EmbeddingBagCollection;
            its ``embeddings`` is replaced by a HotlineEmbeddingBagCollection holding the
            same weights (copied chunk by chunk).
        cfg: the run; uses ``cfg.train`` (optimizers, learning rates, schedule, seed) and
            ``cfg.hotline`` (hot budget, sample rate, relearn interval, logger size, slow tier,
            readahead, thread placement).
        total_steps: the run's length in optimizer steps (the default decay length).
        run_dir: the run's output directory; the disk tier's scratch file goes there unless
            ``cfg.hotline.slow_tier_dir`` is set (the file is unlinked as soon as it is mapped);
            with ``cfg.hotline.slow_tier_file`` that file is the disk tier, used in place.
        tables: the real tables when ``model`` was built with ``stand_in_tables(tables)``:
            their rows are then made tier by tier from the seed of the model's stand-in
            embeddings (``TableInit``), the values an ordinary model built at the same point
            starts from, instead of copied from the model.
        progress: show progress bars while initialising, saving and loading rows.
        timer: charges the parts of each step to components (see ``TrainStep``).
        optimization: the optimizers and schedules (default: those of ``cfg.train`` over ``total_steps``).

    Example:
        >>> model = build_model(cfg.model, 13, tables)
        >>> with HotlineTraining(model, cfg, total_steps=1000, run_dir=out) as hotline:
        ...     for batch in batches:
        ...         loss = hotline.step(batch)
        ...     print(hotline.stats()["popular_fraction"])
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: RunConfig,
        total_steps: int,
        run_dir: str | Path,
        tables: list[TableConfig] | None = None,
        progress: bool = False,
        timer: StepTimer | None = None,
        optimization: Optimization | None = None,
    ) -> None:
        t, h = cfg.train, cfg.hotline
        optimization = optimization or Optimization.of(t, total_steps)
        self.model = model
        self.progress = progress
        row_optimizer = embedding_optimizer(cfg)
        directory = Path(h.slow_tier_dir or run_dir)
        device = next(model.parameters()).device
        tier_kwargs = dict(optimizer=row_optimizer, slow=h.slow_tier, directory=directory, progress=progress, readahead=h.readahead, slow_file=h.slow_tier_file)
        if tables is None:
            self.embeddings = HotlineEmbeddingBagCollection.from_embedding_bags(model.embeddings, **tier_kwargs)
        else:
            init = stacked_rows_init(model.embeddings.initializer.for_tables(tables))  # where the ordinary model starts
            self.embeddings = HotlineEmbeddingBagCollection(tables, device, init=init, dtype=model.embeddings.weight.dtype, **tier_kwargs)
        model.embeddings = self.embeddings
        try:
            self.optimizers = [*optimization.optimizers(model), TieredRowOptimizer(self.embeddings, lr=optimization.embedding_lr)]
            self.schedulers = optimization.schedulers(self.optimizers)
            self.train_step = TrainStep(model, self.optimizers, self.schedulers, timer=timer)
            self.budget_bytes = parse_bytes(h.hot_budget, "hotline.hot_budget")
            total_rows = self.embeddings.space.total_rows
            logger_bytes = parse_bytes(h.logger_size, "hotline.logger_size") if h.logger_size else DEFAULT_LOGGER_BYTES
            self.logger = AccessLogger(logger_bytes, h.sample_rate, seed=t.seed, total_rows=total_rows)
            disk = self.embeddings.store.slow_directory
            placement = ThreadPlacement.away_from_disk(disk, torch.get_num_threads()) if h.place_threads and disk is not None else None
            self.pipeline = HotlinePipeline(self.embeddings, self.logger, self.budget_bytes, h.relearn_every, placement=placement)
        except BaseException:
            self.embeddings.close()
            raise

    def step(self, batch: Batch, normalizer: float | None = None) -> torch.Tensor:
        """One training step on ``batch``; the loss, detached (as ``TrainStep.__call__``): the
        mean, or the sum over the samples / ``normalizer``.

        On an error no gradient of the failed step survives, dense or embedding.
        """
        try:
            loss = self.pipeline.run(batch, self.train_step.backward, normalizer)
        except BaseException:
            self.train_step.zero_grad()
            raise
        self.train_step.apply()
        return loss

    __call__ = step

    def learn(self, batches: Iterable[Batch]) -> int:
        """Learn the hot set from ``batches`` now, without training on them: every id of each
        is counted (no sampling) and the hot set selected and moved to the fast tier at once,
        a learning phase shortened to these batches (e.g. to measure the accelerated phase
        alone). Returns the number of hot rows."""
        return self.pipeline.learn(batches).num_rows

    def stats(self) -> dict[str, Any]:
        """What Hotline did so far: fractions of samples run popular and of lookups served
        hot, re-learnings, hot rows, the bytes of the fast tier, slow tier and logger, and
        the CPUs of the step and the prefetch worker (when placed)."""
        s, store = self.pipeline.stats, self.embeddings.store
        return {
            **s.summary(int(self.embeddings.hot_ids.numel()), self.budget_bytes),
            "fast_tier_bytes": store.fast_bytes,
            "slow_tier_bytes": store.slow_bytes,
            "slow_tier": store.slow_kind,
            "logger_bytes": self.logger.nbytes,
            "sampled_batches": self.logger.sampled_batches,
            **(self.pipeline.placement.describe() if self.pipeline.placement is not None else {}),
        }

    def state_dict(self) -> dict[str, Any]:
        """Small state: dense model, optimizers, schedulers, pipeline counters (see ``save``)."""
        return {
            "model": self.model.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "pipeline": self.pipeline.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        for opt, s in zip(self.optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(s)
        for scheduler, s in zip(self.schedulers, state["schedulers"], strict=True):
            scheduler.load_state_dict(s)
        self.pipeline.load_state_dict(state["pipeline"])

    def save(self, directory: str | Path) -> None:
        """Write the rows of both tiers (weights and optimizer state), the hot set and the
        logger's entries into ``directory``, each file atomically, memory bounded."""
        directory = Path(directory)
        self.embeddings.store.save(directory, progress=self.progress)
        with atomic_path(directory / HOT_IDS_FILE) as tmp, open(tmp, "wb") as f:
            np.save(f, self.embeddings.hot_ids.cpu().numpy())
        self.logger.save(directory / LOGGER_FILE)

    def load(self, directory: str | Path) -> None:
        """Continue from the files ``save`` wrote into ``directory`` (same tables and config)."""
        directory = Path(directory)
        missing = [name for name in (BASE_FILE, HOT_IDS_FILE, LOGGER_FILE) if not (directory / name).is_file()]
        if missing:
            raise DistrecError(f"{str(directory)!r} has no {missing[0]}; resume a run that was trained with --hotline")
        hot_ids = read_hot_ids(directory / HOT_IDS_FILE, self.embeddings.space.total_rows)
        self.embeddings.store.load(directory, progress=self.progress)  # first: the rows are never initialised
        self.pipeline.use_hot_set(HotSet.from_global_ids(hot_ids, self.embeddings.space, self.budget_bytes))
        try:
            self.logger.load(directory / LOGGER_FILE)
        except DistrecError as e:  # e.g. the older 13-byte entries, or another hotline.logger_size
            log.warning(f"{e}: the access logger starts empty instead (the hot rows and the model are restored; only the next re-learning sees fewer samples)")

    def close(self) -> None:
        """Stop the prefetch worker and release both tiers."""
        try:
            self.pipeline.close()
        finally:
            self.embeddings.close()

    def __enter__(self) -> HotlineTraining:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
