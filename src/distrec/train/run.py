"""A run: its directory's files, its metrics log, its data splits, seeding, memory, checks
before launch, resuming."""

from __future__ import annotations

import json
import os
import random
import resource
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distrec import config as config_mod
from distrec.components.checkpoint import find_checkpoint, has_checkpoint
from distrec.config import DataConfig, RunConfig
from distrec.data import Dataset, prepare
from distrec.errors import DistrecError
from distrec.io import atomic_write_json, read_json
from distrec.modes import check_mode
from distrec.parallel.plan import ShardingPlan
from distrec.tower_partition import resolve_towers
from distrec.train.checkpointer import read_run_meta
from distrec.train.tensorboard import TensorBoardSink

CONFIG_FILE = "config.yaml"
RESOLVED_FILE = "resolved.json"  # what the trainer chose where the config left it open (``distrec.train.length``)
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
BREAKDOWN_FILE = "breakdown.json"
PLAN_FILE = "plan.json"
TENSORBOARD_DIR = "tensorboard"  # event files of a --tensorboard run


def _records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The lines of a metrics log with their records. A last line cut short (a run killed while
    writing it) is dropped with a note; any other unreadable line is one DistrecError."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError("no step")
        except ValueError:
            if number == len(lines):
                print(f"distrec: dropping the unfinished last line of {path} (the run was stopped while writing it)", file=sys.stderr)
                break
            raise DistrecError(f"{path} line {number} is not a metrics record; restore the file from a copy of the run, or delete the line") from None
        records.append((line, record))
    return records


class MetricsLog:
    """Append-only metrics.jsonl; on resume, entries written after the checkpoint are dropped.

    With ``tensorboard``, every record is also written as TensorBoard scalars into the
    ``TENSORBOARD_DIR`` beside ``path`` (``distrec.train.tensorboard``), with the same resume rule.
    """

    def __init__(self, path: Path, keep_through_step: int | None, tensorboard: bool = False) -> None:
        self.path = path
        self.tensorboard = TensorBoardSink(path.parent / TENSORBOARD_DIR, keep_through_step) if tensorboard else None
        if keep_through_step is None:
            path.write_text("")
        elif path.exists():
            kept = [line for line, record in _records(path) if record["step"] <= keep_through_step]
            path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.record(record)

    def timings(self, step: int, samples_per_s: float, steps_ms: list[dict[str, float]]) -> None:
        """Speed and time breakdown (``TensorBoardSink.timings``), to TensorBoard only: they differ
        between identical runs, and a resumed run's metrics.jsonl equals an uninterrupted one's."""
        if self.tensorboard is not None:
            self.tensorboard.timings(step, samples_per_s, steps_ms)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def write_settings(run_dir: Path, cfg: RunConfig, resolved: dict[str, Any], plan: ShardingPlan | None) -> None:
    """Write the run's config as given, what the trainer resolved and the sharding plan (if any)."""
    config_mod.save(cfg, run_dir / CONFIG_FILE)
    atomic_write_json(run_dir / RESOLVED_FILE, resolved)
    if plan is not None:
        plan.save(run_dir / PLAN_FILE)


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


def split_rows(dataset: Dataset, cfg: RunConfig) -> dict[str, np.ndarray]:
    """The run's train/val/test rows of ``dataset``; DistrecError when the training split is empty."""
    splits = dataset.split(cfg.data.split, seed=cfg.train.seed)
    if len(splits["train"]) == 0:
        raise DistrecError(f"the training split is empty ({dataset.num_rows} rows, split {cfg.data.split!r}); use more data or a smaller holdout")
    return splits


def prepare_per_host(data: DataConfig, rank: int, distributed: bool, progress: bool) -> Path:
    """Parse the data into the cache once per host (local rank 0 first, then the others read
    it; a collective when ``distributed``); the cache's path."""
    first_on_host = int(os.environ.get("LOCAL_RANK", rank)) == 0
    if distributed and not first_on_host:
        dist.barrier()
    cache = prepare(data, progress=progress and rank == 0)
    if distributed and first_on_host:
        dist.barrier()
    return cache


def check_run(cfg: RunConfig, world_size: int, progress: bool = True) -> None:
    """Fail early, before workers start: parse the data into the cache, pick the parallel mode
    and let it check the tables (plan, topology, towers).

    Raises DistrecError for anything a worker would reject (bad data, empty split, a refused
    combination, a plan that does not fit the tables, the world size or the memory limit).
    """
    dataset = Dataset(prepare(cfg.data, progress=progress), cfg.data)
    split_rows(dataset, cfg)
    check_mode(cfg, world_size, dataset.tables(cfg.model.embedding_dim))


def resume_config(run_dir: Path, epochs: int | None, max_steps: int | None, eval_every: int | None, parallel: dict[str, str] | None = None) -> RunConfig:
    """The saved config of ``run_dir`` with a raised training length (and, to reshard, new
    ``parallel`` fields such as ``plan`` or ``sharding``). The batch size and evaluation
    interval the run chose itself (``RESOLVED_FILE``) stay those of the resumed run."""
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
    saved = config_mod.read_file(path)  # an unreadable file is named by its own message
    try:
        config_mod.from_dict(saved)
    except DistrecError as e:
        raise DistrecError(f"the run's settings {str(path)!r} are invalid ({e}); put back the value the run was trained with") from None
    cfg = config_mod.load(path, overrides)
    resolved = Path(run_dir) / RESOLVED_FILE
    if resolved.is_file():
        chosen: Any = read_json(resolved, "resolved run settings", "resume a run directory written by 'distrec train'", "retrain the run")
        try:
            batch_size, every = int(chosen["batch_size"]), int(chosen["eval_every"])
        except (TypeError, KeyError, ValueError):
            raise DistrecError(
                f"{str(resolved)!r} lacks the run's batch_size or eval_every; retrain the run, or delete the file to choose them again"
            ) from None
        if cfg.train.batch_size is None:
            cfg.train.batch_size = batch_size
        if cfg.train.eval_every == 0 and eval_every is None:
            cfg.train.eval_every = every
    parallel = parallel or {}
    if "plan" in parallel or "sharding" in parallel:  # a new plan replaces the saved one
        cfg.parallel.plan = cfg.parallel.sharding = None
    if parallel.get("replica_groups") == 1:  # plain sharding: no replicas to sync
        plain = config_mod.ParallelConfig()
        cfg.parallel.replica_sync, cfg.parallel.sync_every, cfg.parallel.replica_average = plain.replica_sync, plain.sync_every, plain.replica_average
    for key, value in parallel.items():
        setattr(cfg.parallel, key, value)
    config_mod.validate(cfg)
    check_saved_towers(run_dir, cfg)
    return cfg


def check_saved_towers(run_dir: Path, cfg: RunConfig) -> None:
    """Raise DistrecError when the towers ``cfg`` names (``--towers`` file, or strided over
    ``--hosts``) are not those the run's checkpoint was trained with (a file edited, moved or
    swapped since would train another model)."""
    if not has_checkpoint(run_dir):
        return
    meta = read_run_meta(find_checkpoint(run_dir))
    saved = meta.get("towers")
    if saved is None:
        return
    names = [t["name"] for t in meta["tables"]]
    source = f"the tower partition {cfg.parallel.towers!r}" if cfg.parallel.towers else f"the towers strided over {cfg.parallel.tower_count} hosts"
    try:
        towers = resolve_towers(names, cfg.parallel.towers, cfg.parallel.tower_count)
    except DistrecError as e:
        raise DistrecError(f"{source} no longer loads ({e}); put back the file the run was trained with") from None
    if [[names[f] for f in tower] for tower in towers] != saved["features"]:
        raise DistrecError(f"{source} differs from the towers {str(run_dir)!r} was trained with; put back the original file, or train a new run with it")
