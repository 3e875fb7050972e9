"""The command-line flags made from the config (``distrec.cli.flags``): every flag of the
hand-written parser still exists and sets the same field, and each flag's choices, type and
"(default X)" come from its config field."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
from typing import get_type_hints

import pytest

from distrec import config
from distrec.cli import build_parser
from distrec.cli.flags import FLAGS, field_docs, field_owner

# `distrec train --help`'s options before its flags were made from the config
TRAIN_OPTIONS = [
    "--preset",
    "--config",
    "--set",
    "--data",
    "--data-format",
    "--schema",
    "--cache-dir",
    "--strict",
    "--no-progress",
    "--split",
    "--max-ind-range",
    "--epochs",
    "--max-steps",
    "--patience",
    "--batch-size",
    "--lr",
    "--optimizer",
    "--eval-every",
    "--seed",
    "--out",
    "--resume",
    "--tensorboard",
    "--overwrite",
    "--trust-checkpoint",
    "--nproc-per-node",
    "--max-restarts",
    "--timeout-seconds",
    "--plan",
    "--sharding",
    "--embeddings",
    "--memory-per-rank",
    "--lookup",
    "--hosts",
    "--ranks-per-host",
    "--towers",
    "--tower-sharding",
    "--hosts-per-tower",
    "--replica-groups",
    "--replica-sync",
    "--sync-every",
    "--replica-average",
    "--tower-module",
    "--compression",
    "--tower-dim",
    "--tower-c",
    "--tower-p",
    "--hotline",
    "--hot-budget",
    "--sample-rate",
    "--relearn-every",
]

# the command-line attribute -> config field map the hand-written flags had (cli/args.py's CONFIG_FIELDS)
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
    "table_dtype": "model.table_dtype",
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

DEFAULT_IN_HELP = re.compile(r"\(default ([^)]*)\)$")


def train_actions() -> dict[str, argparse.Action]:
    """``distrec train``'s arguments by their option string."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {option: action for action in sub.choices["train"]._actions for option in action.option_strings}


def field_of(flag) -> tuple[object, object]:
    """(dataclass default, type hint) of the config field that ``flag`` sets."""
    owner, name = field_owner(flag.field)
    default = next(f.default for f in dataclasses.fields(owner) if f.name == name)
    return default, get_type_hints(owner)[name]


def test_every_option_of_the_hand_written_parser_still_exists():
    assert set(TRAIN_OPTIONS) <= set(train_actions())


def test_every_flag_keeps_its_dest_and_config_field():
    assert {flag.dest: flag.field for flag in FLAGS} == CONFIG_FIELDS
    actions = train_actions()
    assert all(actions[flag.option].dest == flag.dest for flag in FLAGS)


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.option)
def test_the_help_shows_the_config_default(flag):
    help_text = train_actions()[flag.option].help % {}
    default, _ = field_of(flag)
    shown = DEFAULT_IN_HELP.search(help_text)
    if default is None or isinstance(default, bool):
        assert shown is None and "(default" not in help_text, help_text  # the docstring says what unset means
    else:
        assert shown is not None, help_text
        loaded = config.load(None, [f"{flag.field}={shown.group(1)}"])  # the shown text read as the field's type
        assert functools.reduce(getattr, flag.field.split("."), loaded) == default


def test_a_changed_default_changes_the_help(monkeypatch):
    sample_rate = next(f for f in dataclasses.fields(config.HotlineConfig) if f.name == "sample_rate")
    monkeypatch.setattr(sample_rate, "default", 0.25)
    assert train_actions()["--sample-rate"].help.endswith("(default 0.25)")


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.option)
def test_choices_and_type_come_from_the_field(flag):
    action = train_actions()[flag.option]
    _, hint = field_of(flag)
    value_type = config.unwrap_optional(hint)
    assert action.choices == config.literal_values(hint)
    if value_type is bool:
        assert isinstance(action, argparse._StoreTrueAction) and action.default is None
    elif action.choices is None:
        assert action.type is value_type and action.metavar == flag.metavar


def test_every_config_field_has_a_docstring():
    sections = [
        config.RunConfig,
        config.DataConfig,
        config.SyntheticConfig,
        config.ModelConfig,
        config.TrainConfig,
        config.ParallelConfig,
        config.HotlineConfig,
    ]
    for section in sections:
        assert set(field_docs(section)) == {f.name for f in dataclasses.fields(section)}, section.__name__


def test_without_source_the_help_has_only_the_default(monkeypatch):
    import inspect

    def no_source(obj):
        raise OSError("could not get source code")

    field_docs.cache_clear()
    monkeypatch.setattr(inspect, "getsource", no_source)
    try:
        actions = train_actions()
    finally:
        field_docs.cache_clear()
    assert actions["--sample-rate"].help == "(default 0.05)" and actions["--plan"].help == ""


def test_evaluate_reads_the_runs_data_settings_so_its_help_shows_no_config_default():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.option_strings[0]: a for a in sub.choices["evaluate"]._actions if a.option_strings}
    assert actions["--data"].help == "input file or directory (default: the run's own data, scoring its --split)"
    assert all("(default" not in actions[flag.option].help for flag in FLAGS if flag.group == "data" and flag.option != "--data")
