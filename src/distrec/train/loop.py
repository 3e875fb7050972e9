"""The training loop: start -> step -> the periodic log, evaluation and checkpoint -> finish.

One loop for every way of training: ``distrec.modes.build_mode`` turns the run's parallel
spec into a mode, which makes the model (built the same on every rank from the same seed)
this rank's and gives the training step; the loop never asks which mode it runs. Under
``torchrun`` each rank trains on its slice of every global batch; evaluations, checkpoints
and the time breakdown are collective.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from distrec import config as config_mod
from distrec.components.breakdown import StepTimer
from distrec.components.checkpoint import BEST_DIR, find_checkpoint
from distrec.components.optimization import Optimization
from distrec.config import RunConfig
from distrec.data import Dataset
from distrec.data.batch import Batch
from distrec.data.fingerprint import check_run_data, save_fingerprint
from distrec.io import atomic_write_json
from distrec.models.build import build_model
from distrec.modes import build_mode
from distrec.parallel.comm import init_from_env, mean_over_ranks
from distrec.parallel.mode import RunContext, merged, parallelize
from distrec.train import run as run_files
from distrec.train.checkpointer import Checkpointer, RandomGenerators
from distrec.train.early_stopping import BestModel, OverfitWatch, small_validation_warning
from distrec.train.evaluate import default_device, evaluate_sharded
from distrec.train.finite_loss import FiniteLossCheck
from distrec.train.interrupts import RunRequests, StopRequested
from distrec.train.length import Position, resolve_length
from distrec.train.run import MetricsLog, peak_rss_per_rank, prepare_per_host, seed_everything, split_rows
from distrec.train.summary import Summary, breakdown_description, reported_model

logger = logging.getLogger(__name__)


class Trainer:
    """Trains one model, on one process or as one rank of a torch.distributed group.

    Args:
        cfg: the run's configuration, as given (the trainer's choices: ``length``, ``optimization``).
        out: the run directory (config, metrics, summary, breakdown, plan, checkpoint).
        progress: show progress bars (on rank 0).
        device: default: this rank's accelerator, else the host.
    """

    def __init__(self, cfg: RunConfig, out: Path, progress: bool = True, device: torch.device | None = None) -> None:
        self.cfg, self.out = cfg, Path(out)
        self.device = device or default_device()
        self.rank, self.world_size = init_from_env(self.device, cfg.parallel.timeout_seconds)
        self.distributed = self.world_size > 1
        self.show_progress = progress and self.rank == 0
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        seed_everything(cfg.train.seed)
        self.dataset = Dataset(prepare_per_host(cfg.data, self.rank, self.distributed, progress), cfg.data)
        self.splits = split_rows(self.dataset, cfg)
        self.dataset.fit_dense_transforms(self.splits["train"])  # CSV/Parquet: on the training rows, saved in every checkpoint
        self.tables = self.dataset.tables(cfg.model.embedding_dim)
        self.timer = StepTimer(self.device)
        self.length, notes = resolve_length(cfg.train, len(self.splits["train"]), len(self.splits.get("val", ())), cfg.data.split)
        for note in notes if self.rank == 0 else []:
            print(f"distrec: {note}", file=sys.stderr)
        if self.rank == 0 and self.length.until_converged and (warning := small_validation_warning(self.dataset.labels(self.splits["val"]))):
            logger.warning(warning)
        self.optimization = Optimization.of(cfg.train, self.length.total_steps)
        ctx = RunContext(
            cfg, self.tables, self.dataset.num_dense, self.rank, self.world_size, self.device, self.out, self.length.total_steps, self.timer, self.show_progress
        )
        self.mode = build_mode(ctx)
        layout = self.mode.model_layout()
        # built on the host, so that every rank draws the same initial weights in any mode
        model = build_model(cfg.model, self.dataset.num_dense, layout.tables, device="cpu", towers=layout.towers)
        parallel = parallelize(model, self.mode, self.optimization)
        self.module, self.model, self.train_step = parallel.module, parallel.model, parallel.train_step
        self.telemetry = merged(parallel.telemetry)
        self.timer.watch_embeddings(self.model.embeddings, self.telemetry.exchange)
        self.position = Position()
        self.best, self.overfit = BestModel(cfg.train.patience), OverfitWatch(self.length.steps_per_epoch)
        parts = {"progress": self.position, "rng": RandomGenerators(), "best": self.best}
        self.checkpointer = Checkpointer(self.out, self.mode, parallel.checkpoint, parts, self._run_meta)
        self.all_to_all_bytes = 0  # sent by this rank's embedding exchanges in this invocation's training steps
        self._saved_step: int | None = None  # the step of the newest checkpoint this run wrote or resumed from
        self.losses = FiniteLossCheck(self.distributed)
        self.requests = RunRequests(self.distributed, cfg.train.checkpoint_minutes)

    def close(self) -> None:
        """Release what outlives a step (the mode's worker threads and files)."""
        self.mode.close()

    def _run_meta(self) -> dict[str, Any]:
        """The run's entries of a checkpoint's metadata (the mode's format adds its layout)."""
        meta = {"step": self.position.step, "num_dense": self.dataset.num_dense, "world_size": self.world_size}
        meta["dense_transforms"] = [t.to_dict() for t in self.dataset.dense_transforms]
        return {**meta, "tables": [t.to_dict() for t in self.tables], "config": config_mod.to_dict(self.cfg)}

    # --- the run's life: start, steps, the periodic work, finish -----------------------------
    def fit(self, resume: bool = False) -> dict[str, Any] | None:
        """Train to the run's length; write metrics, checkpoint, breakdown and summary into
        ``out``. Returns the summary on rank 0 (None on the other ranks)."""
        if not self._start(resume):
            return self._nothing_to_do()
        with self.requests:
            return self._train(resume)

    def _train(self, resume: bool) -> dict[str, Any] | None:
        log = MetricsLog(self.out / run_files.METRICS_FILE, self.position.step if resume else None, self.cfg.train.tensorboard) if self.rank == 0 else None
        first_step, started = self.position.step, time.perf_counter()
        total = None if self.length.until_converged else self.length.total_steps
        last_val: dict[str, float] = {}
        evaluated_at: int | None = None
        # closed however the loop ends, so that a message after a stop starts on its own line
        with tqdm(total=total, initial=first_step, unit="step", disable=not self.show_progress, dynamic_ncols=True) as bar:
            while not self._done():
                for batch in self.timer.loading(self._epoch_batches(), self.device):
                    loss = self._step(batch)
                    bar.update(1)
                    samples_s = (self.position.step - first_step) * self.length.batch_size / (time.perf_counter() - started)
                    evaluated = self._periodic(log, bar, loss, samples_s)
                    if evaluated is not None:
                        last_val, evaluated_at = evaluated, self.position.step
                    if self._done():
                        break
                else:
                    self.position.epoch += 1
                    self.position.step_in_epoch = 0
        elapsed = time.perf_counter() - started
        if evaluated_at != self.position.step:
            last_val = self._evaluate_and_log(log) or last_val
        return self._finish(log, last_val, self.position.step - first_step, elapsed)

    def _start(self, resume: bool) -> bool:
        """Continue the run's checkpoint, or start a new run in ``out``; whether there is
        anything left to train. Writes the config, the resolved settings and the plan."""
        main = self.rank == 0
        if main:
            self.out.mkdir(parents=True, exist_ok=True)
        if resume:
            check_run_data(self.out, self.cfg.data)  # refuses data that changed since the run started
            self.checkpointer.load(find_checkpoint(self.out))
            self._saved_step = self.position.step
            if self._done():
                return False
        elif main:
            save_fingerprint(self.out, self.cfg.data)
            shutil.rmtree(self.out / BEST_DIR, ignore_errors=True)  # the best model of a run this one replaces
            if self.cfg.train.optimizer is None or self.cfg.train.lr is None:
                print(f"distrec: {self.optimization.describe()}", file=sys.stderr)
            print(f"distrec: writing the run to {self.out}", file=sys.stderr)  # a resume says where it starts instead
        if main:
            resolved = {**dataclasses.asdict(self.length), "optimization": dataclasses.asdict(self.optimization)}
            run_files.write_settings(self.out, self.cfg, resolved, self.mode.plan)
        return True

    def _epoch_batches(self) -> Iterator[Batch]:
        """This rank's batches of the rest of the current epoch (pinned for a GPU; fresh rows
        after the first epoch on synthetic data, ``Dataset.batches``)."""
        t, p, rows = self.cfg.train, self.position, self.splits["train"]
        where = {"shard": (self.rank, self.world_size), "pin": self.device.type == "cuda"}
        return self.dataset.batches(rows, self.length.batch_size, shuffle=True, seed=t.seed, epoch=p.epoch, start_step=p.step_in_epoch, fresh=True, **where)

    def _step(self, batch: Batch) -> torch.Tensor:
        """One optimizer step on this rank's part of a global batch; its loss (detached)."""
        global_size = min(self.length.batch_size, len(self.splits["train"]) - self.position.step_in_epoch * self.length.batch_size)
        loss = self.train_step(batch, normalizer=global_size / self.world_size)
        with self.timer.phase("loss"):  # a collective on several ranks when a check is due: part of the step's time
            if self.losses.add(loss, self.position.step + 1):
                self._check_losses()
        self.timer.end_step()
        exchange = self.telemetry.exchange()
        if exchange is not None:
            self.all_to_all_bytes += exchange.input_bytes + exchange.output_bytes
        self.position.step += 1
        self.position.step_in_epoch += 1
        return loss

    def _periodic(self, log: MetricsLog | None, bar: tqdm, loss: torch.Tensor, samples_s: float) -> dict[str, float] | None:
        """After a step: log the mean loss over ranks, evaluate, checkpoint, each when its
        interval says, and stop after a signal; the evaluation's metrics, if one ran (collectives)."""
        t, step = self.cfg.train, self.position.step
        if t.log_every and step % t.log_every == 0:
            self._check_losses()
            mean_loss = mean_over_ranks(loss)
            bar.set_postfix(loss=f"{mean_loss:.4f}", samples_s=f"{samples_s:,.0f}")
            if log is not None:
                log.write({"step": step, "epoch": self.position.epoch, "split": "train", "loss": mean_loss, **self.telemetry.training()})
                log.timings(step, samples_s, self.timer.steps[-t.log_every :])
        every = self.length.eval_every
        evaluated = self._evaluate_and_log(log) if every and step % every == 0 and step < self.length.total_steps else None
        agreed = self.requests.agreed(step)  # a signal or a checkpoint due by time, on any rank
        if (t.checkpoint_every and step % t.checkpoint_every == 0) or agreed.save or agreed.stop is not None:
            self._save()
        if agreed.stop is not None:
            raise StopRequested(agreed.stop)  # every rank at this step, the checkpoint saved
        return evaluated

    def _finish(self, log: MetricsLog | None, last_val: dict[str, float], trained: int, elapsed: float) -> dict[str, Any] | None:
        """Save, report the best model when early stopping kept one, score the test split and
        write the breakdown and the summary; the summary on rank 0."""
        self._save()
        reported = reported_model(self.position.step, last_val, self.best.step, self.best.metrics)
        if reported["model"] == "best":
            self.checkpointer.restore_model(self.out / BEST_DIR)  # report (and test) the best model
            last_val = self.best.metrics
        test = self._evaluate_and_log(log, "test")
        if log is not None:
            log.close()
        peak_rss = peak_rss_per_rank(self.distributed)
        if self.rank != 0:
            return None
        dense_bytes = sum(p.numel() * p.element_size() for p in self.model.dense_parameters()) if self.distributed else 0
        self.timer.write(
            self.out / run_files.BREAKDOWN_FILE,
            **breakdown_description(self.world_size, self.mode.embeddings, self.mode.plan, self.length.batch_size, self.timer, dense_bytes),
        )
        summary = Summary(
            metrics=last_val,
            steps=self.position.step,
            epochs=self.position.epoch + self.position.step_in_epoch / self.length.steps_per_epoch,
            samples_per_s=trained * self.length.batch_size / elapsed if elapsed > 0 and trained else 0.0,
            train_rows=int(len(self.splits["train"])),
            world_size=self.world_size,
            embeddings=self.mode.embeddings,
            all_to_all_bytes=self.all_to_all_bytes,
            peak_rss_bytes_per_rank=peak_rss,
            stopping=self.length.stopping(self.best),
            extra={**reported, **self.telemetry.summary()},
            test=test,
        ).to_dict()
        atomic_write_json(self.out / run_files.SUMMARY_FILE, summary)
        return summary

    def _check_losses(self) -> None:
        self.losses.check(self.optimization.lr, self._saved_step)

    def _save(self) -> None:
        self._check_losses()  # a diverged model is never saved
        self.checkpointer.save()
        self.requests.saved()
        self._saved_step = self.position.step

    # --- evaluation and stopping -------------------------------------------------------------
    def evaluate_split(self, split: str) -> dict[str, float]:
        """Click metrics on a split, every rank predicting its slice of each batch (collective)."""
        rows = self.splits.get(split)
        if rows is None or len(rows) == 0:
            return {}
        metrics = evaluate_sharded(self.module, self.dataset, rows, self.cfg.train.eval_batch_size, self.device, self.rank, self.world_size)
        return {**metrics, **self.telemetry.evaluation()}

    def _evaluate_and_log(self, log: MetricsLog | None, split: str = "val") -> dict[str, float]:
        """Evaluate ``split`` and log it; on "val", keep a better model as ``best/`` (early stopping) and warn of overfitting."""
        self._check_losses()
        result = self.evaluate_split(split)
        if result and log is not None:
            log.write({"step": self.position.step, "epoch": self.position.epoch, "split": split, **result})
        if result and split == "val":
            if self.length.until_converged and self.best.update(result, self.position.step):
                self.checkpointer.save(BEST_DIR)
            if self.rank == 0 and (warning := self.overfit.check(result, self.position.step)):
                logger.warning(warning)
        return result

    def _done(self) -> bool:
        return self.length.done(self.position.step, self.best)

    def _nothing_to_do(self) -> dict[str, Any] | None:
        """A resumed run that already trained its length: say so, write nothing; its summary."""
        if self.rank != 0:
            return None
        step = self.position.step
        converged = self.length.converged(self.best)
        done = (
            f"stopped at step {step}, {self.length.stopping(self.best)['stopped']}"
            if converged
            else f"already trained {step} of {self.length.total_steps} steps"
        )
        logger.warning(f"{self.out} {done}: nothing to do; raise --max-steps or --epochs to train further")
        summary = self.out / run_files.SUMMARY_FILE
        return json.loads(summary.read_text()) if summary.is_file() else None

    # --- per step ----------------------------------------------------------------------------


def train(cfg: RunConfig, out: Path, resume: bool = False, progress: bool = True) -> dict[str, Any] | None:
    """Train ``cfg`` into ``out`` (continuing its checkpoint when ``resume``); the summary on rank 0."""
    trainer = Trainer(cfg, out, progress=progress)
    try:
        return trainer.fit(resume=resume)
    finally:
        trainer.close()
