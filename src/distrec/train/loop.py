"""The training loop: data -> model -> steps -> evaluations -> checkpoints -> summary."""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from tqdm import tqdm

from distrec import config as config_mod
from distrec.config import RunConfig
from distrec.data import Dataset, prepare
from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.io import atomic_write_json
from distrec.models.build import build_model
from distrec.tables import TableConfig
from distrec.train.checkpoint import find_checkpoint, load_state, read_meta, save_checkpoint
from distrec.train.metrics import click_metrics
from distrec.train.optim import make_optimizers
from distrec.train.schedule import make_schedulers
from distrec.train.step import TrainStep

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


def default_device() -> torch.device:
    """The accelerator when one is present, else the host."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Progress:
    """Where training stands: optimizer steps done, and the position inside the epoch."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0


@torch.no_grad()
def predict(model: torch.nn.Module, batches: Iterator[Batch], device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Labels and click probabilities for every sample of ``batches``."""
    was_training = model.training
    model.eval()
    labels, probs = [], []
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        probs.append(torch.sigmoid(model(batch)).float().cpu().numpy())
        labels.append(batch.labels.cpu().numpy())
    model.train(was_training)
    if not labels:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    return np.concatenate(labels), np.concatenate(probs)


def evaluate(model: torch.nn.Module, dataset: Dataset, rows: np.ndarray, batch_size: int, device: torch.device) -> dict[str, float]:
    """Click metrics of ``model`` on the given rows of ``dataset``."""
    labels, probs = predict(model, dataset.batches(rows, batch_size, shuffle=False), device)
    return click_metrics(labels, probs)


def _steps_per_epoch(num_rows: int, batch_size: int) -> int:
    return max(1, math.ceil(num_rows / batch_size))


def _total_steps(cfg: RunConfig, steps_per_epoch: int) -> int:
    return cfg.train.max_steps if cfg.train.max_steps is not None else cfg.train.epochs * steps_per_epoch


def resume_config(run_dir: Path, epochs: int | None, max_steps: int | None, eval_every: int | None) -> RunConfig:
    """The saved config of ``run_dir`` with a raised training length."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise DistrecError(f"cannot resume {str(run_dir)!r}: {CONFIG_FILE} not found; pass the --out directory of an earlier run")
    overrides = []
    if epochs is not None:
        overrides.append(f"train.epochs={epochs}")
    if max_steps is not None:
        overrides.append(f"train.max_steps={max_steps}")
    if eval_every is not None:
        overrides.append(f"train.eval_every={eval_every}")
    return config_mod.load(path, overrides)


class MetricsLog:
    """Append-only metrics.jsonl; on resume, entries written after the checkpoint are dropped."""

    def __init__(self, path: Path, keep_through_step: int | None) -> None:
        self.path = path
        if keep_through_step is None:
            path.write_text("")
        elif path.exists():
            kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= keep_through_step]
            path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


class Trainer:
    """Trains one model on one process; the same object drives the distributed path."""

    def __init__(self, cfg: RunConfig, out: Path, progress: bool = True, device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.out = Path(out)
        self.show_progress = progress
        self.device = device or default_device()
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        seed_everything(cfg.train.seed)
        cache = prepare(cfg.data, progress=progress)
        self.dataset = Dataset(cache, cfg.data)
        self.splits = self.dataset.split(cfg.data.split, seed=cfg.train.seed)
        if len(self.splits["train"]) == 0:
            raise DistrecError(f"the training split is empty ({self.dataset.num_rows} rows, split {cfg.data.split!r}); use more data or a smaller holdout")
        self.tables: list[TableConfig] = self.dataset.tables(cfg.model.embedding_dim)
        self.model = build_model(cfg.model, self.dataset.num_dense, self.tables, device=self.device)
        t = cfg.train
        self.optimizers = make_optimizers(self.model, t.optimizer, t.lr, embedding_name=t.embedding_optimizer, embedding_lr=t.embedding_lr)
        self.steps_per_epoch = _steps_per_epoch(len(self.splits["train"]), t.batch_size)
        self.total_steps = _total_steps(cfg, self.steps_per_epoch)
        self.schedulers = make_schedulers(self.optimizers, t.warmup_steps, t.decay, t.decay_start_step, t.decay_steps or self.total_steps)
        self.step_fn = TrainStep(self.model, self.optimizers, self.schedulers)
        self.progress = Progress()

    # --- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "progress": vars(self.progress).copy(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)
        for sch, s in zip(self.schedulers, state["schedulers"]):
            sch.load_state_dict(s)
        self.progress = Progress(**state["progress"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])

    def checkpoint_meta(self) -> dict[str, Any]:
        return {
            "step": self.progress.step,
            "num_dense": self.dataset.num_dense,
            "tables": [t.to_dict() for t in self.tables],
            "config": config_mod.to_dict(self.cfg),
        }

    def save(self) -> None:
        save_checkpoint(self.out, {0: self.state_dict()}, self.checkpoint_meta())

    # --- loop ----------------------------------------------------------------------------
    def _evaluate_and_log(self, log: MetricsLog, split: str = "val") -> dict[str, float]:
        rows = self.splits.get(split)
        if rows is None or len(rows) == 0:
            return {}
        result = evaluate(self.model, self.dataset, rows, self.cfg.train.eval_batch_size, self.device)
        log.write({"step": self.progress.step, "epoch": self.progress.epoch, "split": split, **result})
        return result

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to the configured length; write metrics, checkpoint and summary into ``out``."""
        self.out.mkdir(parents=True, exist_ok=True)
        if resume:
            ckpt = find_checkpoint(self.out)
            read_meta(ckpt)
            self.load_state_dict(load_state(ckpt, 0, map_location=self.device))
        config_mod.save(self.cfg, self.out / "config.yaml")
        log = MetricsLog(self.out / METRICS_FILE, self.progress.step if resume else None)
        t = self.cfg.train
        start_step = self.progress.step
        bar = tqdm(total=self.total_steps, initial=start_step, unit="step", disable=not self.show_progress, dynamic_ncols=True)
        started = time.perf_counter()
        last_val: dict[str, float] = {}
        train_rows = self.splits["train"]
        while self.progress.step < self.total_steps:
            batches = self.dataset.batches(
                train_rows, t.batch_size, shuffle=True, seed=t.seed, epoch=self.progress.epoch, start_step=self.progress.step_in_epoch
            )
            for batch in batches:
                loss = self.step_fn(batch.to(self.device, non_blocking=True))
                self.progress.step += 1
                self.progress.step_in_epoch += 1
                bar.update(1)
                if self.progress.step % 50 == 0:
                    elapsed = time.perf_counter() - started
                    bar.set_postfix(loss=f"{float(loss):.4f}", samples_s=f"{(self.progress.step - start_step) * t.batch_size / elapsed:,.0f}")
                if t.eval_every and self.progress.step % t.eval_every == 0 and self.progress.step < self.total_steps:
                    last_val = self._evaluate_and_log(log)
                if t.checkpoint_every and self.progress.step % t.checkpoint_every == 0:
                    self.save()
                if self.progress.step >= self.total_steps:
                    break
            else:
                self.progress.epoch += 1
                self.progress.step_in_epoch = 0
        elapsed = time.perf_counter() - started
        bar.close()
        trained = self.progress.step - start_step
        last_val = self._evaluate_and_log(log) or last_val
        test = self._evaluate_and_log(log, "test")
        self.save()
        summary = {
            **{k: last_val.get(k, math.nan) for k in ("auc", "logloss", "accuracy", "ne")},
            "steps": self.progress.step,
            "epochs": self.progress.epoch + self.progress.step_in_epoch / self.steps_per_epoch,
            "samples_per_s": trained * t.batch_size / elapsed if elapsed > 0 and trained else 0.0,
            "train_rows": int(len(train_rows)),
            "val_rows": int(last_val.get("rows", 0)),
        }
        if test:
            summary["test"] = test
        atomic_write_json(self.out / SUMMARY_FILE, summary)
        return summary


def train(cfg: RunConfig, out: Path, resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg`` into ``out`` (continuing its checkpoint when ``resume``); returns the summary."""
    return Trainer(cfg, out, progress=progress).fit(resume=resume)


def load_trained_model(checkpoint: Path, device: torch.device | None = None) -> tuple[torch.nn.Module, RunConfig, list[TableConfig], dict[str, Any]]:
    """The model saved in a run (or its ``checkpoint/`` folder), on ``device``.

    Returns (model, the run's config, its tables as trained, the checkpoint's metadata).
    """
    ckpt = find_checkpoint(checkpoint)
    meta = read_meta(ckpt)
    cfg = config_mod.from_dict(meta["config"])
    device = device or default_device()
    tables = [TableConfig.from_dict(t) for t in meta["tables"]]
    model = build_model(cfg.model, meta["num_dense"], tables, device=device)
    model.load_state_dict(load_state(ckpt, 0, map_location=device)["model"])
    return model, cfg, tables, meta


def evaluate_checkpoint(
    checkpoint: Path,
    data_path: str | None,
    data_format: str | None,
    schema: str | None = None,
    cache_dir: str | None = None,
    strict: bool | None = None,
    batch_size: int = 16384,
    progress: bool = True,
) -> dict[str, float]:
    """Metrics of a saved model on every row of a data set, hashed as in the saved run."""
    device = default_device()
    model, cfg, tables, meta = load_trained_model(checkpoint, device)
    if data_path is not None:
        cfg.data.path = data_path
        cfg.data.format = data_format or cfg.data.format
    if schema is not None:
        cfg.data.schema = schema
    if cache_dir is not None:
        cfg.data.cache_dir = cache_dir
    if strict is not None:
        cfg.data.strict = strict
    dataset = Dataset(prepare(cfg.data, progress=progress), cfg.data)
    if dataset.num_dense != meta["num_dense"] or [t.name for t in dataset.tables(cfg.model.embedding_dim)] != [t.name for t in tables]:
        raise DistrecError("the evaluation data has different features than the model was trained on; use data in the same format and schema")
    dataset.override_tables(tables)
    rows = np.arange(dataset.num_rows, dtype=np.int64)
    return evaluate(model, dataset, rows, batch_size, device)
