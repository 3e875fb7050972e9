"""The training loop: data -> step -> evaluate -> checkpoint -> summary.

One loop for every way of training. The parallel mode (``distrec.modes.select_mode``: one
process, sharded, local, SPTT, DMT towers, Hotline, ...) turns the model, built the same on
every rank from the same seed, into this rank's (``distrec.parallel.mode.parallelize``) and
gives the training step; the loop never asks which mode it runs. Under ``torchrun`` (or
``distrec train --nproc-per-node``) each rank trains on its slice of every global batch;
evaluations, checkpoints and the time breakdown are collective.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from distrec import config as config_mod
from distrec.components.breakdown import StepTimer
from distrec.components.checkpoint import BEST_DIR, find_checkpoint
from distrec.config import MAX_EPOCHS, RunConfig, auto_batch_size, auto_eval_every
from distrec.data import Dataset, prepare
from distrec.data.batch import Batch
from distrec.data.fingerprint import check_run_data, save_fingerprint
from distrec.errors import DistrecError
from distrec.io import atomic_write_json
from distrec.models.build import build_model
from distrec.modes import select_mode
from distrec.parallel.comm import init_from_env
from distrec.parallel.mode import RunContext, parallelize
from distrec.tables import TableConfig
from distrec.train.checkpointer import Checkpointer, RandomGenerators
from distrec.train.early_stopping import BestModel
from distrec.train.evaluate import default_device, predict
from distrec.train.metrics import click_metrics
from distrec.train.run import BREAKDOWN_FILE, CONFIG_FILE, METRICS_FILE, PLAN_FILE, SUMMARY_FILE, MetricsLog, peak_rss_per_rank, seed_everything, split_rows

METRICS = ("auc", "logloss", "accuracy", "ne")
logger = logging.getLogger(__name__)


@dataclass
class Progress:
    """Where training stands: optimizer steps done, and the position inside the epoch."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step, self.epoch, self.step_in_epoch = int(state["step"]), int(state["epoch"]), int(state["step_in_epoch"])


class Trainer:
    """Trains one model, on one process or as one rank of a torch.distributed group.

    Args:
        cfg: the run's configuration.
        out: the run directory (config, metrics, summary, breakdown, plan, checkpoint).
        progress: show a progress bar (on rank 0).
        device: default: this rank's accelerator, else the host.
    """

    def __init__(self, cfg: RunConfig, out: Path, progress: bool = True, device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.out = Path(out)
        self.device = device or default_device()
        self.rank, self.world_size = init_from_env(self.device, cfg.parallel.timeout_seconds)
        self.distributed = self.world_size > 1
        self.show_progress = progress and self.rank == 0
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        seed_everything(cfg.train.seed)
        self.dataset = Dataset(self._prepare_data(progress), cfg.data)
        self.splits = split_rows(self.dataset, cfg)
        self.tables: list[TableConfig] = self.dataset.tables(cfg.model.embedding_dim)
        self.timer = StepTimer(self.device)
        self.steps_per_epoch, self.total_steps = self._resolve_length()
        ctx = RunContext(
            cfg, self.tables, self.dataset.num_dense, self.rank, self.world_size, self.device, self.out, self.total_steps, self.timer, self.show_progress
        )
        self.mode = select_mode(cfg, self.world_size)(ctx)
        # built on the host, so that every rank draws the same initial weights in any mode
        model = build_model(cfg.model, self.dataset.num_dense, self.mode.model_tables(), device="cpu", towers=self.mode.towers())
        parallel = parallelize(model, self.mode)
        self.module, self.model, self.step_fn = parallel.module, parallel.model, parallel.step
        self.progress = Progress()
        self.best = BestModel(cfg.train.patience)
        self.checkpointer = Checkpointer(self.out, self.mode, {"progress": self.progress, "rng": RandomGenerators(), "best": self.best}, self._run_meta)
        self.all_to_all_bytes = 0  # sent by this rank's embedding exchanges in this invocation's training steps
        self._saved_step: int | None = None  # the step of the newest checkpoint this run wrote or resumed from

    def _resolve_length(self) -> tuple[int, int]:
        """Steps per epoch and the most steps to train, after filling the unset batch size and
        evaluation interval from the data (into ``cfg``, so the saved config resumes as is)."""
        t, train_rows, val_rows = self.cfg.train, len(self.splits["train"]), len(self.splits.get("val", ()))
        if t.batch_size is None:
            t.batch_size = auto_batch_size(train_rows)
            self._announce(f"batch size {t.batch_size} for {train_rows:,} training rows (--batch-size to choose)")
        steps_per_epoch = max(1, math.ceil(train_rows / t.batch_size))
        if t.max_steps is not None:
            return steps_per_epoch, t.max_steps
        if t.epochs is not None:
            return steps_per_epoch, t.epochs * steps_per_epoch
        if val_rows == 0:
            t.epochs = 1
            self._announce(f"no validation rows to stop on (split {self.cfg.data.split!r}): training 1 epoch; give --epochs or --max-steps")
            return steps_per_epoch, steps_per_epoch
        if t.eval_every == 0:
            t.eval_every = auto_eval_every(steps_per_epoch)
        self._announce(
            f"training until the validation AUC stops improving for {t.patience} evaluations, one every {t.eval_every} steps "
            f"(at most {MAX_EPOCHS} epochs; --epochs or --max-steps for a fixed length)"
        )
        return steps_per_epoch, MAX_EPOCHS * steps_per_epoch

    def _announce(self, line: str) -> None:
        if self.rank == 0:
            print(f"distrec: {line}", file=sys.stderr)

    def close(self) -> None:
        """Release what outlives a step (the mode's worker threads and files)."""
        self.mode.close()

    def _prepare_data(self, progress: bool) -> Path:
        """Parse the data into the cache once per host (local rank 0 first, then the others read it)."""
        first_on_host = int(os.environ.get("LOCAL_RANK", self.rank)) == 0
        if self.distributed and not first_on_host:
            dist.barrier()
        cache = prepare(self.cfg.data, progress=progress and self.rank == 0)
        if self.distributed and first_on_host:
            dist.barrier()
        return cache

    def _save(self) -> None:
        self.checkpointer.save()
        self._saved_step = self.progress.step

    def _run_meta(self) -> dict[str, Any]:
        """The run's entries of a checkpoint's metadata (the mode adds its layout)."""
        return {
            "step": self.progress.step,
            "num_dense": self.dataset.num_dense,
            "tables": [t.to_dict() for t in self.tables],
            "config": config_mod.to_dict(self.cfg),
            "world_size": self.world_size,
        }

    # --- evaluation ----------------------------------------------------------------------
    def evaluate_split(self, split: str) -> dict[str, float]:
        """Click metrics on a split, every rank predicting its slice of each batch (collective)."""
        rows = self.splits.get(split)
        if rows is None or len(rows) == 0:
            return {}
        batches = self.dataset.batches(rows, self.cfg.train.eval_batch_size, shuffle=False, shard=(self.rank, self.world_size))
        labels, probs = predict(self.module, batches, self.device)
        if self.distributed:
            parts: list[tuple[np.ndarray, np.ndarray]] = [None] * self.world_size  # type: ignore[list-item]
            dist.all_gather_object(parts, (labels, probs))
            labels, probs = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        return {**click_metrics(labels, probs), **self.mode.evaluation_extra()}

    def _evaluate_and_log(self, log: MetricsLog | None, split: str = "val") -> dict[str, float]:
        result = self.evaluate_split(split)
        if result and log is not None:
            log.write({"step": self.progress.step, "epoch": self.progress.epoch, "split": split, **result})
        return result

    def _timed(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """``batches`` on this rank's device, the wait for each charged to ``data_loading``."""
        while True:
            with self.timer.phase("data_loading"):
                batch = next(batches, None)
                if batch is not None:
                    batch = batch.to(self.device, non_blocking=True)
            if batch is None:
                return
            yield batch

    def _mean_over_ranks(self, value: torch.Tensor) -> float:
        if self.distributed:
            value = value.clone()
            dist.all_reduce(value)
            value /= self.world_size
        return float(value)

    # --- loop ----------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> dict[str, Any] | None:
        """Train to the configured length; write metrics, checkpoint, breakdown and summary
        into ``out``. Returns the summary on rank 0 (None on the other ranks)."""
        main = self.rank == 0
        if main:
            self.out.mkdir(parents=True, exist_ok=True)
        if resume:
            check_run_data(self.out, self.cfg.data)  # refuses data that changed since the run started
            self.checkpointer.load(find_checkpoint(self.out))
            self._saved_step = self.progress.step
        elif main:
            save_fingerprint(self.out, self.cfg.data)
            shutil.rmtree(self.out / BEST_DIR, ignore_errors=True)  # the best model of a run this one replaces
            self._announce(f"writing the run to {self.out}")  # a resume says where it starts instead
        if resume and (self.progress.step >= self.total_steps or self._converged()):
            return self._nothing_to_do()
        log = MetricsLog(self.out / METRICS_FILE, self.progress.step if resume else None, self.cfg.train.tensorboard) if main else None
        if main:
            config_mod.save(self.cfg, self.out / CONFIG_FILE)
            if self.mode.plan is not None:
                self.mode.plan.save(self.out / PLAN_FILE)
        t = self.cfg.train
        start_step = self.progress.step
        bar = tqdm(total=None if t.until_converged else self.total_steps, initial=start_step, unit="step", disable=not self.show_progress, dynamic_ncols=True)
        started = time.perf_counter()
        last_val: dict[str, float] = {}
        evaluated_at: int | None = None
        train_rows = self.splits["train"]
        while self.progress.step < self.total_steps and not self._converged():
            batches = self.dataset.batches(
                train_rows,
                t.batch_size,
                shuffle=True,
                seed=t.seed,
                epoch=self.progress.epoch,
                start_step=self.progress.step_in_epoch,
                shard=(self.rank, self.world_size),
            )
            for batch in self._timed(batches):
                global_size = min(t.batch_size, len(train_rows) - self.progress.step_in_epoch * t.batch_size)
                loss = self.step_fn(batch, normalizer=global_size / self.world_size)
                with self.timer.phase("loss"):  # a collective on several ranks: part of the step's time
                    self._stop_unless_finite(loss)
                self.timer.end_step()
                exchange = self.mode.exchange_stats()
                if exchange is not None:
                    self.all_to_all_bytes += exchange.input_bytes + exchange.output_bytes
                self.progress.step += 1
                self.progress.step_in_epoch += 1
                bar.update(1)
                if t.log_every and self.progress.step % t.log_every == 0:
                    mean_loss = self._mean_over_ranks(loss)
                    samples_s = (self.progress.step - start_step) * t.batch_size / (time.perf_counter() - started)
                    bar.set_postfix(loss=f"{mean_loss:.4f}", samples_s=f"{samples_s:,.0f}")
                    if log is not None:
                        log.write({"step": self.progress.step, "epoch": self.progress.epoch, "split": "train", "loss": mean_loss, **self.mode.training_extra()})
                        log.timings(self.progress.step, samples_s, self.timer.steps[-t.log_every :])
                if t.eval_every and self.progress.step % t.eval_every == 0 and self.progress.step < self.total_steps:
                    last_val, evaluated_at = self._evaluate_and_keep_best(log), self.progress.step
                if t.checkpoint_every and self.progress.step % t.checkpoint_every == 0:
                    self._save()
                if self.progress.step >= self.total_steps or self._converged():
                    break
            else:
                self.progress.epoch += 1
                self.progress.step_in_epoch = 0
        elapsed = time.perf_counter() - started
        bar.close()
        trained = self.progress.step - start_step
        if evaluated_at != self.progress.step:
            last_val = self._evaluate_and_keep_best(log) or last_val
        self._save()
        if self.best.step is not None and self.best.step != self.progress.step:
            self.checkpointer.restore_model(self.out / BEST_DIR)  # report (and test) the best model
            last_val = self.best.metrics
        test = self._evaluate_and_log(log, "test")
        if log is not None:
            log.close()
        peak_rss = peak_rss_per_rank(self.distributed)
        if not main:
            return None
        self.timer.write(self.out / BREAKDOWN_FILE, **self._breakdown_extra())
        summary = {
            **{k: last_val.get(k, math.nan) for k in METRICS},
            "steps": self.progress.step,
            "epochs": self.progress.epoch + self.progress.step_in_epoch / self.steps_per_epoch,
            "samples_per_s": trained * t.batch_size / elapsed if elapsed > 0 and trained else 0.0,
            "train_rows": int(len(train_rows)),
            "val_rows": int(last_val.get("rows", 0)),
            "world_size": self.world_size,
            "embeddings": self.mode.embeddings,
            "all_to_all_bytes": self.all_to_all_bytes,
            "peak_rss_bytes_per_rank": peak_rss,
            **{k: v for k, v in last_val.items() if k not in (*METRICS, "rows")},  # the mode's evaluation extras
            **self.mode.summary_extra(),
            **self._stopping_summary(),
        }
        if test:
            summary["test"] = test
        atomic_write_json(self.out / SUMMARY_FILE, summary)
        return summary

    def _evaluate_and_keep_best(self, log: MetricsLog | None) -> dict[str, float]:
        """Evaluate on the validation split; in a run without a fixed length, a better AUC than
        before is saved as ``best/``."""
        result = self._evaluate_and_log(log)
        if result and self.cfg.train.until_converged and self.best.update(result, self.progress.step):
            self.checkpointer.save(BEST_DIR)
        return result

    def _converged(self) -> bool:
        """Whether a run without a fixed length has gone ``patience`` evaluations without a better validation AUC."""
        return self.cfg.train.until_converged and self.best.exhausted

    def _stopping_summary(self) -> dict[str, Any]:
        """Why training stopped, and, without a fixed length, which step's model the summary reports."""
        if not self.cfg.train.until_converged:
            return {"stopped": "reached --max-steps" if self.cfg.train.max_steps is not None else "reached --epochs"}
        if self._converged():
            why = f"no better validation AUC in {self.cfg.train.patience} evaluation{'s' if self.cfg.train.patience != 1 else ''}"
        else:
            why = f"reached {MAX_EPOCHS} epochs"
        return {"best_step": self.best.step, "stopped": why}

    def _nothing_to_do(self) -> dict[str, Any] | None:
        """A resumed run that already trained its length: say so, write nothing; its summary."""
        if self.rank != 0:
            return None
        done = (
            f"stopped at step {self.progress.step}, {self._stopping_summary()['stopped']}"
            if self._converged()
            else f"already trained {self.progress.step} of {self.total_steps} steps"
        )
        logger.warning(f"{self.out} {done}: nothing to do; raise --max-steps or --epochs to train further")
        summary = self.out / SUMMARY_FILE
        return json.loads(summary.read_text()) if summary.is_file() else None

    def _stop_unless_finite(self, loss: torch.Tensor) -> None:
        """Stop the run (every rank, at the same step) when a rank's loss is NaN or infinite,
        before anything of that step is saved; the last checkpoint stays as it was."""
        finite = torch.isfinite(loss).to(torch.int32).reshape(1)
        if self.distributed:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if finite.item():
            return
        saved = f"the last checkpoint (step {self._saved_step}) is kept" if self._saved_step is not None else "no checkpoint was written"
        raise DistrecError(
            f"the training loss became {float(loss)} at step {self.progress.step + 1}; training diverged, lower the learning rate "
            f"(--lr, now {self.cfg.train.lr}) and retrain; {saved}"
        )

    def _breakdown_extra(self) -> dict[str, Any]:
        """What the breakdown describes, and bytes sent per step by this rank's collectives."""
        dense_bytes = sum(p.numel() * p.element_size() for p in self.model.dense_parameters())
        label = f"{self.world_size}p {self.mode.embeddings}"
        if self.mode.plan is not None:
            label += " " + "+".join(sorted({p.sharding for p in self.mode.plan.tables}))
        sent = self.timer.bytes_per_step()
        if not sent["gradient_all_reduce"]:  # a mode that reduces its own gradients (Hotline) charged its real bytes
            sent["gradient_all_reduce"] = dense_bytes if self.distributed else 0
        return {
            "label": label,
            "world_size": self.world_size,
            "embeddings": self.mode.embeddings,
            "batch_size": self.cfg.train.batch_size,
            "bytes_per_step": sent,
        }


def train(cfg: RunConfig, out: Path, resume: bool = False, progress: bool = True) -> dict[str, Any] | None:
    """Train ``cfg`` into ``out`` (continuing its checkpoint when ``resume``); the summary on rank 0."""
    trainer = Trainer(cfg, out, progress=progress)
    try:
        return trainer.fit(resume=resume)
    finally:
        trainer.close()
