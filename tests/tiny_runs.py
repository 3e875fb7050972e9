"""Small training runs shared by the distributed-training tests: a config, and what a run logged."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from distrec import config
from distrec.train.evaluate import load_trained_model
from distrec.train.loop import train

# --set items of a tiny synthetic data set: 1080 training rows in batches of 70, so the last
# batch of an epoch is short (30 rows: 8, 8, 7, 7 on 4 ranks); multi-hot bags of 2; every
# epoch the same rows, so that a few steps visibly lower the training loss
TINY_DATA = [
    "data.synthetic.rows=1200",
    "data.synthetic.fresh_each_epoch=false",
    "data.synthetic.num_sparse=5",
    "data.synthetic.table_rows=97",
    "data.synthetic.pooling_factor=2",
    "train.batch_size=70",
    "train.optimizer=sgd",
    "train.lr=0.5",
]


def tiny_cli_flags(rows: int, *more: str) -> list[str]:
    """``distrec train`` flags: the tiny preset on ``rows`` synthetic rows with tables of 50
    rows, one thread, no progress bar, then ``more``."""
    return [
        "--preset",
        "tiny",
        "--set",
        f"data.synthetic.rows={rows}",
        "--set",
        "data.synthetic.table_rows=50",
        "--set",
        "train.threads=1",
        "--no-progress",
        *more,
    ]


def tiny_config(cache: Path, steps: int, overrides: tuple[str, ...] = (), **parallel: object) -> config.RunConfig:
    """The tiny preset on TINY_DATA, cached in ``cache``, logging the loss every step, with
    further ``--set`` items ``overrides``."""
    items = [
        *TINY_DATA,
        f"data.cache_dir={json.dumps(str(cache))}",
        f"train.max_steps={steps}",
        "train.log_every=1",
        *[f"parallel.{k}={json.dumps(v)}" for k, v in parallel.items()],
        *overrides,
    ]
    return config.load(None, items, preset="tiny")


def train_losses(run: Path) -> list[float]:
    """The training losses a run logged, one per step."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["split"] == "train"]


def train_on_rank(rank: int, world_size: int, cfg: config.RunConfig, out: Path, resume: bool = False) -> None:
    """``train`` as one rank of a ``run_distributed`` group."""
    train(cfg, out, resume=resume, progress=False)


def trained_parameters(run: Path) -> dict[str, torch.Tensor]:
    """Every parameter of the model a run saved, gathered into one process."""
    model, *_ = load_trained_model(run, torch.device("cpu"))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_parameters(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    """The same parameter names, every value within ``atol``."""
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=lambda m: f"{name}: {m}")
