"""Argument groups and config resolution shared by several subcommands."""

from __future__ import annotations

import argparse
import json
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from distrec.cli.flags import FLAGS, add_flags
from distrec.config import PRESETS
from distrec.errors import DistrecError

EXAMPLES_FORMAT = argparse.RawDescriptionHelpFormatter


def add_data_args(p: argparse._ActionsContainer, data_default: str | None = None) -> None:
    """The data flags of ``FLAGS`` (--data, --data-format, --schema, --cache-dir, --strict) and
    --no-progress. ``data_default``, when given, is the data a command reads without --data (a
    run's): --data's help says it and the other flags' help shows no config default."""
    if data_default is None:
        add_flags(p, "data")
    else:
        add_flags(p, "data", {"--data": f"input file or directory (default: {data_default})"}, with_defaults=False)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_config_args(p: argparse.ArgumentParser) -> None:
    """--preset, --config, --set."""
    p.add_argument("--preset", metavar="NAME", help=f"architecture preset: {', '.join(PRESETS)}")
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


def config_from_args(args: argparse.Namespace):
    """The RunConfig of a command: --config file, then --preset, then flags and --set overrides."""
    from distrec import config

    overrides = list(args.overrides)
    for flag in FLAGS:
        value = getattr(args, flag.dest, None)
        if value is not None:
            overrides.append(f"{flag.field}={json.dumps(value)}")
    cfg = config.load(args.config, overrides, preset=args.preset)
    if getattr(args, "data", None) and getattr(args, "data_format", None) is None and cfg.data.format == "synthetic":
        raise DistrecError("--data needs --data-format (criteo, movielens, csv or parquet), or a --config that sets data.format")
    return cfg


def check_hotline_flags(args: argparse.Namespace, cfg: Any) -> None:
    """DistrecError when a flag of Hotline's (``--hot-budget``, ...) is given for a run without
    Hotline, which would ignore it."""
    given = [f.option for f in FLAGS if f.group == "hotline" and f.field != "hotline.enabled" and getattr(args, f.dest, None) is not None]
    if given and not cfg.hotline.enabled:
        raise DistrecError(f"{given[0]} applies to Hotline, which this run does not use; add --hotline or drop {given[0]}")


def data_options(args: argparse.Namespace) -> dict[str, Any]:
    """The data flags of a scoring command (``add_data_args``), as the scoring functions name them."""
    return {"data_path": args.data, "data_format": args.data_format, "schema": args.schema, "cache_dir": args.cache_dir, "strict": args.strict}
