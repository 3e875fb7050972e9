"""Argument groups and config resolution shared by several subcommands."""

from __future__ import annotations

import argparse
import json
from contextlib import AbstractContextManager, nullcontext

from distrec.errors import DistrecError

EXAMPLES_FORMAT = argparse.RawDescriptionHelpFormatter


def add_data_args(p: argparse.ArgumentParser, data_default: str = "generated synthetic data") -> None:
    """--data, --data-format, --schema, --cache-dir, --strict, --no-progress; ``data_default``
    says in the help what is read without --data."""
    p.add_argument("--data", metavar="PATH", help=f"input file or directory (default: {data_default})")
    p.add_argument("--data-format", choices=["criteo", "movielens", "csv", "parquet", "synthetic"], help="input format")
    p.add_argument("--schema", metavar="FILE", help="YAML schema for csv/parquet: label, dense and categorical columns")
    p.add_argument("--cache-dir", metavar="DIR", help="where parsed data is cached (default $DISTREC_CACHE or ~/.cache/distrec)")
    p.add_argument("--strict", action="store_true", default=None, help="stop at the first malformed row instead of skipping it")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_config_args(p: argparse.ArgumentParser) -> None:
    """--preset, --config, --set."""
    p.add_argument("--preset", metavar="NAME", help="architecture preset: dlrm-kaggle, dlrm-terabyte, dlrm-mlperf, dcn, tiny")
    p.add_argument("--config", metavar="FILE", help="YAML experiment config (sections data, model, train, parallel)")
    p.add_argument(
        "--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides", help="override a config field, e.g. model.embedding_dim=64 (repeatable)"
    )


def add_trust_arg(p: argparse.ArgumentParser) -> None:
    """--trust-checkpoint: let an older checkpoint's pickled state load (it could run code)."""
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load a checkpoint of an earlier distrec (format 2) whose state holds pickled Python objects; "
        "unpickling runs any code they hold, so only for checkpoints from a trusted source",
    )


def trusting(args: argparse.Namespace) -> AbstractContextManager:
    """The context in which a command loads checkpoints: pickles allowed with --trust-checkpoint."""
    from distrec.components.checkpoint import trusting_pickles

    return trusting_pickles() if args.trust_checkpoint else nullcontext()


def check_at_least(flag: str, value: int | None, minimum: int) -> None:
    """DistrecError unless the integer option ``flag`` (None when not given) is at least ``minimum``."""
    if value is not None and value < minimum:
        raise DistrecError(f"{flag} is {value}; it must be at least {minimum}")


# command-line attribute -> config field it overrides
CONFIG_FIELDS = {
    "data": "data.path",
    "data_format": "data.format",
    "schema": "data.schema",
    "cache_dir": "data.cache_dir",
    "strict": "data.strict",
    "split": "data.split",
    "max_ind_range": "data.max_ind_range",
    "epochs": "train.epochs",
    "max_steps": "train.max_steps",
    "patience": "train.patience",
    "batch_size": "train.batch_size",
    "lr": "train.lr",
    "optimizer": "train.optimizer",
    "eval_every": "train.eval_every",
    "seed": "train.seed",
    "tensorboard": "train.tensorboard",
    "plan": "parallel.plan",
    "sharding": "parallel.sharding",
    "embeddings": "parallel.embeddings",
    "lookup": "parallel.lookup",
    "hosts": "parallel.hosts",
    "ranks_per_host": "parallel.ranks_per_host",
    "towers": "parallel.towers",
    "tower_sharding": "parallel.tower_sharding",
    "hosts_per_tower": "parallel.hosts_per_tower",
    "memory_per_rank": "parallel.memory_per_rank",
    "replica_groups": "parallel.replica_groups",
    "replica_sync": "parallel.replica_sync",
    "sync_every": "parallel.sync_every",
    "replica_average": "parallel.replica_average",
    "timeout_seconds": "parallel.timeout_seconds",
    "tower_module": "model.tower_module",
    "compression": "model.tower_compression",
    "tower_dim": "model.tower_dim",
    "tower_c": "model.tower_c",
    "tower_p": "model.tower_p",
    "hotline": "hotline.enabled",
    "hot_budget": "hotline.hot_budget",
    "sample_rate": "hotline.sample_rate",
    "relearn_every": "hotline.relearn_every",
}


def config_from_args(args: argparse.Namespace):
    """The RunConfig of a command: --config file, then --preset, then flags and --set overrides."""
    from distrec import config

    overrides = list(args.overrides)
    for attr, key in CONFIG_FIELDS.items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    cfg = config.load(args.config, overrides, preset=args.preset)
    if getattr(args, "data", None) and getattr(args, "data_format", None) is None and cfg.data.format == "synthetic":
        raise DistrecError("--data needs --data-format (criteo, movielens, csv or parquet), or a --config that sets data.format")
    return cfg
