"""Command-line flags made from the config: ``FLAGS`` says which flag sets which config field.

Each flag's argparse argument comes from its field (``distrec.config``): the value's type
from the annotation (one or more values for a field that may hold a list), ``choices`` from
a ``Literal``, ``store_true`` for a bool, and the help
from the field's docstring (its first paragraph) followed by "(default X)" from the
dataclass default (left out for None, whose meaning the docstring gives, and for bools).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_type_hints

from distrec.config import RunConfig, literal_values, takes_list, unwrap_optional


@dataclass(frozen=True)
class Flag:
    """A command-line option that sets one config field."""

    option: str
    """The option string, e.g. ``--hot-budget``; argparse's dest is it without dashes (``hot_budget``)."""
    field: str
    """The dotted config field it sets, e.g. ``hotline.hot_budget``."""
    metavar: str | None = None
    """The value's name in the help; None for choice and bool flags."""
    group: str = "train"
    """The part of a command that adds it: data (``add_data_args``), train, distributed, 2d, dmt or hotline."""

    @property
    def dest(self) -> str:
        """The argparse attribute that holds the flag's value."""
        return self.option.removeprefix("--").replace("-", "_")


FLAGS: list[Flag] = [
    Flag("--data", "data.path", metavar="PATH", group="data"),
    Flag("--data-format", "data.format", group="data"),
    Flag("--schema", "data.schema", metavar="FILE", group="data"),
    Flag("--cache-dir", "data.cache_dir", metavar="DIR", group="data"),
    Flag("--strict", "data.strict", group="data"),
    Flag("--split", "data.split", metavar="SPEC"),
    Flag("--max-ind-range", "data.max_ind_range", metavar="ROWS"),
    Flag("--epochs", "train.epochs", metavar="N"),
    Flag("--max-steps", "train.max_steps", metavar="N"),
    Flag("--patience", "train.patience", metavar="N"),
    Flag("--batch-size", "train.batch_size", metavar="B"),
    Flag("--lr", "train.lr", metavar="X"),
    Flag("--optimizer", "train.optimizer"),
    Flag("--eval-every", "train.eval_every", metavar="N"),
    Flag("--seed", "train.seed", metavar="S"),
    Flag("--table-dtype", "model.table_dtype"),
    Flag("--tensorboard", "train.tensorboard"),
    Flag("--timeout-seconds", "parallel.timeout_seconds", metavar="S", group="distributed"),
    Flag("--plan", "parallel.plan", metavar="FILE", group="distributed"),
    Flag("--sharding", "parallel.sharding", group="distributed"),
    Flag("--embeddings", "parallel.embeddings", group="distributed"),
    Flag("--memory-per-rank", "parallel.memory_per_rank", metavar="SIZE", group="distributed"),
    Flag("--lookup", "parallel.lookup", group="distributed"),
    Flag("--hosts", "parallel.hosts", metavar="H", group="distributed"),
    Flag("--ranks-per-host", "parallel.ranks_per_host", metavar="L", group="distributed"),
    Flag("--towers", "parallel.towers", metavar="JSON", group="distributed"),
    Flag("--tower-sharding", "parallel.tower_sharding", group="distributed"),
    Flag("--hosts-per-tower", "parallel.hosts_per_tower", metavar="K", group="distributed"),
    Flag("--replica-groups", "parallel.replica_groups", metavar="G", group="2d"),
    Flag("--replica-sync", "parallel.replica_sync", group="2d"),
    Flag("--sync-every", "parallel.sync_every", metavar="K", group="2d"),
    Flag("--replica-average", "parallel.replica_average", group="2d"),
    Flag("--tower-module", "model.tower_module", group="dmt"),
    Flag("--compression", "model.tower_compression", metavar="X", group="dmt"),
    Flag("--tower-dim", "model.tower_dim", metavar="D", group="dmt"),
    Flag("--tower-c", "model.tower_c", metavar="C", group="dmt"),
    Flag("--tower-p", "model.tower_p", metavar="P", group="dmt"),
    Flag("--hotline", "hotline.enabled", group="hotline"),
    Flag("--hot-budget", "hotline.hot_budget", metavar="SIZE", group="hotline"),
    Flag("--sample-rate", "hotline.sample_rate", metavar="X", group="hotline"),
    Flag("--relearn-every", "hotline.relearn_every", metavar="N", group="hotline"),
]
"""Every flag that sets a config field, in the order ``--help`` lists them within a group."""


def add_flags(container: argparse._ActionsContainer, group: str, help_overrides: Mapping[str, str] | None = None, with_defaults: bool = True) -> None:
    """Add the arguments of the ``FLAGS`` of ``group`` to a parser or argument group.

    ``help_overrides`` replaces the help of the options it names; ``with_defaults`` False
    leaves "(default X)" out, for a command whose unset flags take other settings (a run's).
    """
    for flag in FLAGS:
        if flag.group == group:
            kwargs = config_argument(flag, with_defaults)
            if help_overrides and flag.option in help_overrides:
                kwargs["help"] = help_overrides[flag.option]
            container.add_argument(flag.option, **kwargs)


def config_argument(flag: Flag, with_default: bool = True) -> dict[str, Any]:
    """The ``add_argument`` keywords of ``flag``, made from its config field (its help says the
    field's default unless ``with_default`` is False)."""
    owner, name = field_owner(flag.field)
    hint = get_type_hints(owner)[name]
    value_type = unwrap_optional(hint)
    choices = literal_values(hint)
    kwargs: dict[str, Any] = {"help": field_help(owner, name, with_default)}
    if value_type is bool:
        kwargs.update(action="store_true", default=None)  # None: the flag was not given, the config decides
    elif choices is not None:
        kwargs["choices"] = choices
    else:
        kwargs.update(type=value_type, metavar=flag.metavar)
        if takes_list(hint):  # a field that may hold a list takes one or more values
            kwargs["nargs"] = "+"
    return kwargs


def field_owner(path: str) -> tuple[type, str]:
    """The config section class that holds the dotted field ``path``, and the field's name."""
    *sections, name = path.split(".")
    owner: type = RunConfig
    for section in sections:
        owner = get_type_hints(owner)[section]
    return owner, name


def field_help(owner: type, name: str, with_default: bool = True) -> str:
    """The help of field ``name`` of ``owner``: the first paragraph of its docstring as a phrase,
    then, ``with_default``, "(default X)" unless the default is None, a bool or made by a factory."""
    doc = field_docs(owner).get(name, "")
    phrase = " ".join(doc.split("\n\n")[0].split()).replace("``", "").rstrip(".")
    if phrase and not phrase[:2].isupper():  # "Rows per ..." -> "rows per ...", "DCN: ..." stays
        phrase = phrase[0].lower() + phrase[1:]
    default = next(f.default for f in dataclasses.fields(owner) if f.name == name)
    if with_default and default is not None and default is not dataclasses.MISSING and not isinstance(default, bool):
        phrase = f"{phrase} (default {_format_default(default)})".strip()
    return phrase.replace("%", "%%")  # argparse expands %(...)s in help


def _format_default(value: object) -> str:
    """A default as the help shows it: 600.0 as 600, 0.05 as 0.05, '512MB' as 512MB."""
    return f"{value:g}" if isinstance(value, float) else str(value)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstrings of the fields of dataclass ``cls`` (the string right below each field), by
    name; empty when its source is not available (then the help has no text but the default)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    class_node = ast.parse(source).body[0]
    if not isinstance(class_node, ast.ClassDef):
        return {}
    docs = {}
    for node, after in zip(class_node.body, class_node.body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs
