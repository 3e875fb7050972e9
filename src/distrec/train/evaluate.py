"""Scoring a model: predictions over batches, click metrics, a saved model in one process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist

from distrec import config as config_mod
from distrec.components.checkpoint import find_checkpoint, load_state
from distrec.config import RunConfig
from distrec.data import Dataset, prepare
from distrec.data.batch import Batch
from distrec.data.fingerprint import check_scored_data
from distrec.data.inputs import describe_paths
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.models.build import build_model
from distrec.modes import saved_format
from distrec.tables import TableConfig
from distrec.train.checkpointer import read_run_meta
from distrec.train.metrics import click_metrics
from distrec.train.run import split_rows


def default_device() -> torch.device:
    """This process's accelerator when one is present (``cuda:LOCAL_RANK``), else the host."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


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


def evaluate_sharded(
    module: torch.nn.Module, dataset: Dataset, rows: np.ndarray, batch_size: int, device: torch.device, rank: int, world_size: int
) -> dict[str, float]:
    """Click metrics of ``rows``, each of ``world_size`` ranks predicting its slice of every
    batch through ``module`` (a collective when ``world_size`` > 1)."""
    labels, probs = predict(module, dataset.batches(rows, batch_size, shuffle=False, shard=(rank, world_size)), device)
    if world_size > 1:
        parts: list[tuple[np.ndarray, np.ndarray]] = [None] * world_size  # type: ignore[list-item]
        dist.all_gather_object(parts, (labels, probs))
        labels, probs = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    if not np.isfinite(probs).all():
        raise DistrecError(
            f"the model predicts NaN for {int(np.count_nonzero(~np.isfinite(probs)))} of {probs.size} rows: its weights hold NaN or infinity; "
            "score an earlier checkpoint, or retrain"
        )
    return click_metrics(labels, probs)


def evaluate(model: torch.nn.Module, dataset: Dataset, rows: np.ndarray, batch_size: int, device: torch.device) -> dict[str, float]:
    """Click metrics of ``model`` on the given rows of ``dataset`` (one process)."""
    return evaluate_sharded(model, dataset, rows, batch_size, device, rank=0, world_size=1)


def load_trained_model(
    checkpoint: Path, device: torch.device | None = None, best: bool = False
) -> tuple[RecommendationModel, RunConfig, list[TableConfig], dict[str, Any]]:
    """The model saved in a run (its last ``checkpoint/``, or its ``best/`` one when ``best``
    and the run kept one) or in a checkpoint folder, in one process, on ``device``.

    A checkpoint of a distributed run is gathered from all its ranks' shards (for a run with
    local embeddings, rank 0's tables are taken). Returns (model, the run's config, its
    tables as trained, the checkpoint's metadata, with ``checkpoint``: the folder read).
    """
    ckpt = find_checkpoint(checkpoint, best=best)
    meta = read_run_meta(ckpt)
    cfg = config_mod.from_dict(meta["config"])
    device = device or default_device()
    tables = [TableConfig.from_dict(t) for t in meta["tables"]]
    towers = None
    if meta.get("towers") is not None:
        index = {t.name: i for i, t in enumerate(tables)}
        towers = [[index[name] for name in tower] for tower in meta["towers"]["features"]]
    own = load_state(ckpt, 0, map_location=device)
    writer = saved_format(ckpt, own, meta)
    model = build_model(cfg.model, meta["num_dense"], writer.restored_tables(tables), device=device, towers=towers)
    writer.restore_model(model, ckpt, own, meta)
    return model, cfg, tables, {**meta, "checkpoint": str(ckpt)}


def scoring_dataset(
    cfg: RunConfig,
    tables: list[TableConfig],
    num_dense: int,
    data_path: str | list[str] | None,
    data_format: str | None,
    schema: str | None = None,
    cache_dir: str | None = None,
    strict: bool | None = None,
    progress: bool = True,
    dense_transforms: list[dict] | None = None,
) -> Dataset:
    """The data a saved model scores, its raw ids hashed into the model's ``tables`` as its run
    hashed them and its dense columns transformed by the run's fitted ``dense_transforms``
    (the checkpoint's; none for formats without them and runs from before them): ``data_path``
    (in ``data_format``, else the run's format), or without it the run's own data (``cfg.data``,
    updated in place with the options given).

    Raises:
        DistrecError: the data's dense or sparse features are not the model's.
    """
    if data_path is not None:
        cfg.data.path = data_path[0] if isinstance(data_path, list) and len(data_path) == 1 else data_path
        cfg.data.format = data_format or cfg.data.format
    if schema is not None:
        cfg.data.schema = schema
    if cache_dir is not None:
        cfg.data.cache_dir = cache_dir
    if strict is not None:
        cfg.data.strict = strict
    dataset = Dataset(prepare(cfg.data, progress=progress), cfg.data)
    if dataset.num_dense != num_dense or dataset.feature_names != [t.name for t in tables]:
        raise DistrecError(
            f"the data has different features than the model: {dataset.num_dense} dense and {_shown(dataset.feature_names)}, the model's "
            f"{num_dense} and {_shown([t.name for t in tables])}; use data in the format and schema the model was trained on"
        )
    dataset.override_tables(tables)
    dataset.use_dense_transforms(dense_transforms or [])
    return dataset


def _shown(names: list[str], limit: int = 6) -> str:
    """``names`` as a short bracketed list: the first ``limit``, then how many more."""
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return "[" + ", ".join(names[:limit]) + more + "]"


def evaluate_checkpoint(
    checkpoint: Path,
    data_path: str | list[str] | None,
    data_format: str | None,
    schema: str | None = None,
    cache_dir: str | None = None,
    strict: bool | None = None,
    batch_size: int = 16384,
    progress: bool = True,
    split: Literal["val", "test", "all"] = "val",
) -> dict[str, float | str]:
    """Metrics of a saved model (a run's best one if it kept one, else its last), hashed as in
    the saved run: on every row of ``data_path`` (a file, directory or glob, or several: e.g.
    the held-out days), or, without it, on the run's own data: its ``split`` (``val``,
    ``test``, split as the run split it, or ``all`` rows).

    The result's ``scored`` says which rows (``all rows of PATH``, ``all rows of 2 paths (A ...
    B)``, ``the run's val split``) and ``checkpoint`` which model.
    """
    device = default_device()
    model, cfg, tables, meta = load_trained_model(checkpoint, device, best=True)
    if data_path is None:  # the run's own rows: only while its data is what it trained on
        check_scored_data(Path(meta["checkpoint"]).parent, cfg.data)
    dataset = scoring_dataset(cfg, tables, meta["num_dense"], data_path, data_format, schema, cache_dir, strict, progress, meta.get("dense_transforms"))
    if data_path is None and split != "all":
        splits = split_rows(dataset, cfg)
        if split not in splits:
            raise DistrecError(f"the run kept no {split} rows (its data.split is {cfg.data.split!r}); score --split val or all, or pass --data")
        rows, scored = splits[split], f"the run's {split} split"
    elif data_path is None:
        rows, scored = np.arange(dataset.num_rows, dtype=np.int64), "all rows of the run's data"
    else:
        rows, scored = np.arange(dataset.num_rows, dtype=np.int64), f"all rows of {describe_paths(data_path)}"
    return {**evaluate(model, dataset, rows, batch_size, device), "scored": scored, "checkpoint": meta["checkpoint"]}
