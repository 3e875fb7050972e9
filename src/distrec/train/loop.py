"""The training loop: data -> model -> steps -> evaluations -> checkpoints -> summary.

One loop for one process or many. Under ``torchrun`` (or ``distrec train --nproc-per-node``)
every rank builds the same model from the same seed, ``distrec.parallel`` shards its
embeddings (or keeps them local) and wraps it in DDP, and each rank trains on its slice of
every global batch; evaluations, checkpoints and the time breakdown are collective.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.optim import Optimizer
from tqdm import tqdm

from distrec import config as config_mod
from distrec.config import RunConfig
from distrec.data import Dataset, prepare
from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.hotline.distributed import DistributedHotlineTraining, replicated_hot_embeddings
from distrec.hotline.training import HotlineTraining, check_parallel, load_into_model
from distrec.io import atomic_write_json
from distrec.models.build import build_model
from distrec.parallel.comm import init_from_env
from distrec.parallel.parallelize import embedding_divergence, parallelize_model, resolve_plan
from distrec.parallel.plan import ShardingPlan
from distrec.parallel.reshard import export_blocks
from distrec.parallel.sptt_embedding import SpttTowerEmbeddings, run_topology, sptt_embeddings, sptt_tower_embeddings
from distrec.tables import TableConfig, stand_in_tables
from distrec.train.breakdown import StepTimer
from distrec.train.checkpoint import (
    find_checkpoint,
    load_state,
    read_meta,
    restore_embeddings,
    restore_towers,
    save_checkpoint,
    save_checkpoint_collectively,
)
from distrec.train.metrics import click_metrics
from distrec.towers.checkpoint import export_towers
from distrec.towers.model import dmt_cost
from distrec.towers.partition import resolve_towers
from distrec.train.rng import capture_rng, restore_rng
from distrec.train.optim import SparseRowOptimizer, make_optimizers, optimizer_of
from distrec.train.schedule import make_schedulers
from distrec.train.step import TrainStep

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
BREAKDOWN_FILE = "breakdown.json"
PLAN_FILE = "plan.json"


def default_device() -> torch.device:
    """This process's accelerator when one is present (``cuda:LOCAL_RANK``), else the host."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def peak_rss_per_rank(distributed: bool) -> list[int]:
    """Peak resident memory (bytes) of every rank's process so far (a collective when distributed)."""
    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    if not distributed:
        return [mine]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


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
    """Click metrics of ``model`` on the given rows of ``dataset`` (one process)."""
    labels, probs = predict(model, dataset.batches(rows, batch_size, shuffle=False), device)
    return click_metrics(labels, probs)


def _total_steps(cfg: RunConfig, steps_per_epoch: int) -> int:
    return cfg.train.max_steps if cfg.train.max_steps is not None else cfg.train.epochs * steps_per_epoch


def resume_config(run_dir: Path, epochs: int | None, max_steps: int | None, eval_every: int | None, parallel: dict[str, str] | None = None) -> RunConfig:
    """The saved config of ``run_dir`` with a raised training length (and, to reshard, new
    ``parallel`` fields such as ``plan`` or ``sharding``)."""
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
    cfg = config_mod.load(path, overrides)
    parallel = parallel or {}
    if "plan" in parallel or "sharding" in parallel:  # a new plan replaces the saved one
        cfg.parallel.plan = cfg.parallel.sharding = None
    for key, value in parallel.items():
        setattr(cfg.parallel, key, value)
    config_mod.validate(cfg)
    return cfg


def split_rows(dataset: Dataset, cfg: RunConfig) -> dict[str, np.ndarray]:
    """The run's train/val/test rows of ``dataset``; DistrecError when the training split is empty."""
    splits = dataset.split(cfg.data.split, seed=cfg.train.seed)
    if len(splits["train"]) == 0:
        raise DistrecError(f"the training split is empty ({dataset.num_rows} rows, split {cfg.data.split!r}); use more data or a smaller holdout")
    return splits


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
        self.rank, self.world_size = init_from_env(self.device)
        self.distributed = self.world_size > 1
        self.show_progress = progress and self.rank == 0
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        seed_everything(cfg.train.seed)
        self.dataset = Dataset(self._prepare_data(progress), cfg.data)
        self.splits = split_rows(self.dataset, cfg)
        self.tables: list[TableConfig] = self.dataset.tables(cfg.model.embedding_dim)
        self.timer = StepTimer(self.device)
        self.plan: ShardingPlan | None = None
        self.hotline: HotlineTraining | DistributedHotlineTraining | None = None
        tiered = cfg.hotline.enabled and not self.distributed  # one process: Hotline's fast and slow tiers
        check_parallel_mode(cfg, self.world_size)
        p = cfg.parallel
        topology = run_topology(self.world_size, p.hosts, p.ranks_per_host) if self.distributed and p.lookup == "sptt" else None
        self.towers: list[list[int]] | None = None
        if cfg.model.tower_module is not None or topology is not None:
            self.towers = resolve_towers([t.name for t in self.tables], p.towers, topology.hosts if topology else p.hosts)
        # built on the host so that every rank draws the same initial weights in any setup;
        # the tables are stand-ins where the real ones are made elsewhere: in the tiers (maybe
        # larger than RAM), or as this rank's shards from the stand-ins' seed (``TableInit``)
        shards_per_rank = self.distributed and (cfg.hotline.enabled or topology is not None or p.embeddings == "sharded")
        tables = stand_in_tables(self.tables) if tiered or shards_per_rank else self.tables
        model = build_model(cfg.model, self.dataset.num_dense, tables, device="cpu", towers=self.towers)
        self.dmt_cost = dmt_cost(cfg.model, self.dataset.num_dense, self.tables, self.towers) if cfg.model.tower_module and self.rank == 0 else None
        if self.distributed and cfg.hotline.enabled:  # hot rows replicated, the rest sharded; no DDP
            self.plan = resolve_plan(self.tables, p, self.world_size)
            model.embeddings = replicated_hot_embeddings(model, self.tables, self.plan, self.device)
            self.module = self.model = model.to(self.device)
        elif self.distributed:
            embeddings = None
            if cfg.model.tower_module is not None:
                embeddings = sptt_tower_embeddings(model.embeddings, self.tables, topology, self.device, p.tower_sharding)
                self.plan = embeddings.bags.plan
            elif topology is not None:
                fill = model.embeddings.initializer.for_tables(self.tables).fill
                embeddings = sptt_embeddings(self.tables, fill, topology, self.towers, self.device, p.tower_sharding)
                self.plan = embeddings.plan
            elif p.embeddings == "sharded":
                self.plan = resolve_plan(self.tables, p, self.world_size)
            self.module = parallelize_model(model, self.tables, p.embeddings, self.plan, self.device, embeddings=embeddings)
            self.model = self.module.module
            self.timer.watch_ddp(self.module)
        else:
            self.module = self.model = model.to(self.device)
        t = cfg.train
        self.steps_per_epoch = max(1, math.ceil(len(self.splits["train"]) / t.batch_size))
        self.total_steps = _total_steps(cfg, self.steps_per_epoch)
        if cfg.hotline.enabled:
            if tiered:
                self.hotline = HotlineTraining(self.model, cfg, self.total_steps, self.out, self.tables, self.show_progress, self.timer)
            else:
                self.hotline = DistributedHotlineTraining(self.model, cfg, self.total_steps, self.timer)
            self.optimizers, self.schedulers, self.step_fn = self.hotline.optimizers, self.hotline.schedulers, self.hotline
        else:
            self.optimizers = make_optimizers(
                self.model, t.optimizer, t.lr, t.embedding_optimizer, t.embedding_lr, t.weight_decay, t.embedding_weight_decay
            )
            self.schedulers = make_schedulers(self.optimizers, t.warmup_steps, t.decay, t.decay_start_step, t.decay_steps or self.total_steps)
            replicas = getattr(self.model.embeddings, "replicas", None)
            sync = self.model.embeddings.sync_replica_grads if replicas is not None and len(replicas) else None
            if isinstance(self.model.embeddings, SpttTowerEmbeddings):
                sync = self.model.embeddings.sync_tower_grads
            self.step_fn = TrainStep(self.module, self.optimizers, self.schedulers, timer=self.timer, sync_gradients=sync)
        self.timer.watch_embeddings(self.model.embeddings)
        self.progress = Progress()
        self.all_to_all_bytes = 0  # sent by this rank's embedding exchanges in this invocation's training steps

    def close(self) -> None:
        """Release what outlives a step: Hotline's prefetch worker and tiers."""
        if self.hotline is not None:
            self.hotline.close()

    @property
    def embedding_mode(self) -> str:
        """``single`` (one process), ``sharded`` or ``local``."""
        return self.cfg.parallel.embeddings if self.distributed else "single"

    def _prepare_data(self, progress: bool) -> Path:
        """Parse the data into the cache once per host (local rank 0 first, then the others read it)."""
        first_on_host = int(os.environ.get("LOCAL_RANK", self.rank)) == 0
        if self.distributed and not first_on_host:
            dist.barrier()
        cache = prepare(self.cfg.data, progress=progress and self.rank == 0)
        if self.distributed and first_on_host:
            dist.barrier()
        return cache

    # --- state ---------------------------------------------------------------------------
    def _sparse_optimizer(self) -> Optimizer | None:
        return next((o for o in self.optimizers if isinstance(o, SparseRowOptimizer)), None)

    def _tower_optimizer(self) -> Optimizer | None:
        return optimizer_of(self.optimizers, self.model.tower_parameters())

    def _saves_towers(self) -> bool:
        """Whether this rank writes its tower modules (one rank per host: local rank 0)."""
        meta = self._tower_meta()
        return meta is not None and self.rank in meta["rank"]

    def rank_state(self) -> dict[str, Any]:
        """This rank's part of a checkpoint: dense weights and optimizer, embedding blocks, progress, RNG."""
        position = {
            "progress": vars(self.progress).copy(),
            "rng": capture_rng(),
        }
        if isinstance(self.hotline, HotlineTraining):  # its tables are files beside this state (see save)
            return {"hotline": self.hotline.state_dict(), "blocks": [], **position}
        sparse, towers = self._sparse_optimizer(), self._tower_optimizer()
        with self.hotline.rows_in_shards() if self.hotline is not None else nullcontext():  # copied: the hot rows leave again
            blocks = export_blocks(self._sharded_embeddings, sparse, include_replicas=self.rank == 0, copy=self.hotline is not None)
        state = {
            "dense": {k: v for k, v in self.model.state_dict().items() if not k.startswith("embeddings.")},
            "dense_optimizers": [o.state_dict() for o in self.optimizers if o is not sparse and o is not towers],
            "sparse_groups": _hyperparameters(sparse),
            "blocks": blocks,
            "towers": export_towers(self.model.embeddings, towers) if self._saves_towers() else [],
            "tower_groups": _hyperparameters(towers),
            "schedulers": [s.state_dict() for s in self.schedulers],
            **position,
        }
        if self.hotline is not None:  # the hot set; its rows are in the blocks
            state["hotline"] = self.hotline.state_dict()
        return state

    @property
    def _sharded_embeddings(self) -> torch.nn.Module:
        """The module holding every table block (behind the hot table with distributed Hotline)."""
        return self.model.embeddings.cold if isinstance(self.hotline, DistributedHotlineTraining) else self.model.embeddings

    def load(self, checkpoint: Path) -> None:
        """Continue from ``checkpoint``, saved with this world size and plan or any other (resharding)."""
        meta = read_meta(checkpoint)
        saved_world = int(meta.get("world_size", 1))
        own = load_state(checkpoint, self.rank if self.rank < saved_world else 0, map_location=self.device)
        if ("hotline" in own) != (self.hotline is not None):
            raise DistrecError(f"checkpoint {str(checkpoint)!r} was {'' if 'hotline' in own else 'not '}trained with Hotline; resume it with the config it was saved with")
        if ("dense" in own) == isinstance(self.hotline, HotlineTraining):
            raise DistrecError(f"checkpoint {str(checkpoint)!r} was trained with Hotline in {'several processes' if 'dense' in own else 'one process'}; resume it with as many")
        if isinstance(self.hotline, HotlineTraining):
            self.hotline.load_state_dict(own["hotline"])
            self.hotline.load(checkpoint)
        else:
            missing, unexpected = self.model.load_state_dict(own["dense"], strict=False)
            if unexpected or any(not k.startswith("embeddings.") for k in missing):
                raise DistrecError(f"checkpoint {str(checkpoint)!r} holds a different model; resume it with the config it was saved with")
            sparse, towers = self._sparse_optimizer(), self._tower_optimizer()
            restore_embeddings(checkpoint, meta, self._sharded_embeddings, sparse, self.rank)
            restore_towers(checkpoint, meta, self.model.embeddings, towers)
            dense_optimizers = [o for o in self.optimizers if o is not sparse and o is not towers]
            for o, s in zip(dense_optimizers, own["dense_optimizers"]):
                o.load_state_dict(s)
            for optimizer, saved_groups in ((sparse, own["sparse_groups"]), (towers, own.get("tower_groups", []))):
                if optimizer is not None:
                    for group, saved in zip(optimizer.param_groups, saved_groups):
                        group.update(saved)
            for sch, s in zip(self.schedulers, own["schedulers"]):
                sch.load_state_dict(s)
            if self.hotline is not None:
                self.hotline.load_state_dict(own["hotline"])
        self.progress = Progress(**own["progress"])
        restore_rng(own["rng"])

    def checkpoint_meta(self, blocks_by_rank: list[list[dict]]) -> dict[str, Any]:
        return {
            "step": self.progress.step,
            "num_dense": self.dataset.num_dense,
            "tables": [t.to_dict() for t in self.tables],
            "config": config_mod.to_dict(self.cfg),
            "world_size": self.world_size,
            "embeddings": self.embedding_mode,
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "blocks": [{"rank": r, "block": b} for r, blocks in enumerate(blocks_by_rank) for b in blocks],
            "towers": self._tower_meta(),
        }

    def _tower_meta(self) -> dict[str, Any] | None:
        """Each tower's feature names and the rank whose state holds its module (None without towers)."""
        if self.towers is None or self.cfg.model.tower_module is None:
            return None
        ranks_per_host = self.world_size // len(self.towers) if self.distributed else 0
        return {
            "features": [[self.tables[f].name for f in tower] for tower in self.towers],
            "rank": [t * ranks_per_host for t in range(len(self.towers))],
        }

    def save(self) -> None:
        """Write a checkpoint (collectively when distributed)."""
        state = self.rank_state()
        index = [b["block"] for b in state["blocks"]]
        if not self.distributed:
            write_files = self.hotline.save if isinstance(self.hotline, HotlineTraining) else None
            save_checkpoint(self.out, {0: state}, self.checkpoint_meta([index]), write_files=write_files)
            return
        all_index: list[list[dict]] = [None] * self.world_size  # type: ignore[list-item]
        dist.all_gather_object(all_index, index)
        save_checkpoint_collectively(self.out, state, self.checkpoint_meta(all_index))

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
        result = click_metrics(labels, probs)
        if self.embedding_mode == "local":
            result["embedding_divergence"] = embedding_divergence(self.model.embeddings)
        return result

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
            self.load(find_checkpoint(self.out))
        log = MetricsLog(self.out / METRICS_FILE, self.progress.step if resume else None) if main else None
        if main:
            config_mod.save(self.cfg, self.out / CONFIG_FILE)
            if self.plan is not None:
                self.plan.save(self.out / PLAN_FILE)
        t = self.cfg.train
        start_step = self.progress.step
        bar = tqdm(total=self.total_steps, initial=start_step, unit="step", disable=not self.show_progress, dynamic_ncols=True)
        started = time.perf_counter()
        last_val: dict[str, float] = {}
        train_rows = self.splits["train"]
        while self.progress.step < self.total_steps:
            batches = self.dataset.batches(
                train_rows, t.batch_size, shuffle=True, seed=t.seed, epoch=self.progress.epoch,
                start_step=self.progress.step_in_epoch, shard=(self.rank, self.world_size),
            )
            for batch in self._timed(batches):
                global_size = min(t.batch_size, len(train_rows) - self.progress.step_in_epoch * t.batch_size)
                loss = self.step_fn(batch, normalizer=global_size / self.world_size)
                self.timer.end_step()
                exchange = getattr(self.model.embeddings, "stats", None)
                if exchange is not None:
                    self.all_to_all_bytes += exchange.input_bytes + exchange.output_bytes
                self.progress.step += 1
                self.progress.step_in_epoch += 1
                bar.update(1)
                if t.log_every and self.progress.step % t.log_every == 0:
                    mean_loss = self._mean_over_ranks(loss)
                    elapsed = time.perf_counter() - started
                    bar.set_postfix(loss=f"{mean_loss:.4f}", samples_s=f"{(self.progress.step - start_step) * t.batch_size / elapsed:,.0f}")
                    if log is not None:
                        log.write({"step": self.progress.step, "epoch": self.progress.epoch, "split": "train", "loss": mean_loss})
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
        peak_rss = peak_rss_per_rank(self.distributed)
        if not main:
            return None
        self.timer.write(self.out / BREAKDOWN_FILE, **self._breakdown_extra())
        summary = {
            **{k: last_val.get(k, math.nan) for k in ("auc", "logloss", "accuracy", "ne")},
            "steps": self.progress.step,
            "epochs": self.progress.epoch + self.progress.step_in_epoch / self.steps_per_epoch,
            "samples_per_s": trained * t.batch_size / elapsed if elapsed > 0 and trained else 0.0,
            "train_rows": int(len(train_rows)),
            "val_rows": int(last_val.get("rows", 0)),
            "world_size": self.world_size,
            "embeddings": self.embedding_mode,
            "all_to_all_bytes": self.all_to_all_bytes,
            "peak_rss_bytes_per_rank": peak_rss,
        }
        if "embedding_divergence" in last_val:
            summary["embedding_divergence"] = last_val["embedding_divergence"]
        if self.hotline is not None:
            summary["hotline"] = self.hotline.stats()
        if self.dmt_cost is not None:
            summary["dmt"] = self.dmt_cost
        if test:
            summary["test"] = test
        atomic_write_json(self.out / SUMMARY_FILE, summary)
        return summary

    def _breakdown_extra(self) -> dict[str, Any]:
        """What the breakdown describes, and bytes sent per step by this rank's collectives."""
        stats = getattr(self.model.embeddings, "stats", None)
        dense_bytes = sum(p.numel() * p.element_size() for p in self.model.dense_parameters())
        label = f"{self.world_size}p {self.embedding_mode}"
        if self.plan is not None:
            label += " " + "+".join(sorted({p.sharding for p in self.plan.tables}))
        return {
            "label": label,
            "world_size": self.world_size,
            "embeddings": self.embedding_mode,
            "batch_size": self.cfg.train.batch_size,
            "bytes_per_step": {
                "input_all_to_all": stats.input_bytes if stats else 0,
                "output_all_to_all": stats.output_bytes if stats else 0,
                "gradient_all_reduce": dense_bytes if self.distributed else 0,
            },
        }


def _hyperparameters(optimizer: Optimizer | None) -> list[dict[str, Any]]:
    """The param groups of ``optimizer`` without their parameters (learning rates and the like)."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] if optimizer else []


def check_parallel_mode(cfg: RunConfig, world_size: int) -> None:
    """Raise DistrecError for a combination of Hotline, tower modules and the parallel
    settings that ``world_size`` processes cannot train."""
    if cfg.hotline.enabled:
        check_parallel(cfg.parallel, world_size)
    if world_size > 1 and cfg.model.tower_module is not None and cfg.parallel.lookup != "sptt":
        raise DistrecError("--tower-module in a multi-process run needs --lookup sptt (tower t on host t); add it")


def check_run(cfg: RunConfig, world_size: int, progress: bool = True) -> None:
    """Fail early, before workers start: parse the data into the cache and check the sharding plan.

    Raises DistrecError for anything a worker would reject (bad data, empty split, a plan
    that does not fit the tables, the world size or the memory limit).
    """
    check_parallel_mode(cfg, world_size)
    dataset = Dataset(prepare(cfg.data, progress=progress), cfg.data)
    split_rows(dataset, cfg)
    if cfg.parallel.towers is not None:
        resolve_towers([t.name for t in dataset.tables(cfg.model.embedding_dim)], cfg.parallel.towers, None)
    if world_size > 1 and cfg.parallel.embeddings == "sharded":
        resolve_plan(dataset.tables(cfg.model.embedding_dim), cfg.parallel, world_size)


def train(cfg: RunConfig, out: Path, resume: bool = False, progress: bool = True) -> dict[str, Any] | None:
    """Train ``cfg`` into ``out`` (continuing its checkpoint when ``resume``); the summary on rank 0."""
    trainer = Trainer(cfg, out, progress=progress)
    try:
        return trainer.fit(resume=resume)
    finally:
        trainer.close()


def load_trained_model(checkpoint: Path, device: torch.device | None = None) -> tuple[torch.nn.Module, RunConfig, list[TableConfig], dict[str, Any]]:
    """The model saved in a run (or its ``checkpoint/`` folder) in one process, on ``device``.

    A checkpoint of a distributed run is gathered from all its ranks' shards (for a run with
    local embeddings, rank 0's tables are taken). Returns (model, the run's config, its
    tables as trained, the checkpoint's metadata).
    """
    ckpt = find_checkpoint(checkpoint)
    meta = read_meta(ckpt)
    cfg = config_mod.from_dict(meta["config"])
    device = device or default_device()
    tables = [TableConfig.from_dict(t) for t in meta["tables"]]
    towers = None
    if meta.get("towers") is not None:
        index = {t.name: i for i, t in enumerate(tables)}
        towers = [[index[name] for name in tower] for tower in meta["towers"]["features"]]
    model = build_model(cfg.model, meta["num_dense"], tables, device=device, towers=towers)
    own = load_state(ckpt, 0, map_location=device)
    if "dense" not in own:  # trained with Hotline's tiers in one process
        load_into_model(model, ckpt, own["hotline"])
    else:
        model.load_state_dict(own["dense"], strict=False)
        restore_embeddings(ckpt, meta, model.embeddings, None, rank=0)
        restore_towers(ckpt, meta, model.embeddings, None)
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
