"""Experiment configuration: typed sections with defaults, YAML files, presets, overrides.

One YAML file describes a run; every field has a default; ``--set section.field=value``
overrides any field from the command line. The resolved config is written into the run's
output folder so every result can be reproduced.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from distrec.errors import DistrecError
from distrec.units import parse_bytes


@dataclass
class SyntheticConfig:
    """A Criteo-shaped synthetic data set (see ``distrec.data.synthetic``)."""

    rows: int = 200_000
    num_dense: int = 13
    num_sparse: int = 26
    table_rows: int = 100_000
    zipf_exponent: float = 1.05
    zipf_exponents: list[float] = field(default_factory=list)  # one per table; empty: zipf_exponent for all
    pooling_factor: int = 1
    interaction_groups: int = 0
    drift_period_rows: int = 0
    seed: int = 1234


@dataclass
class DataConfig:
    """Where the data comes from and how it is split."""

    path: str | None = None
    format: str = "synthetic"
    schema: str | None = None
    cache_dir: str | None = None
    split: str = "random:0.1"
    max_ind_range: int = 100_000
    table_sizes: dict[str, int] = field(default_factory=dict)
    strict: bool = False
    chunk_rows: int = 262_144
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class ModelConfig:
    """The architecture. A preset fixes these; input widths and table sizes come from data.

    ``bottom_mlp`` and ``top_mlp`` list hidden widths only: DLRM's bottom MLP always ends in
    a layer of width ``embedding_dim`` (so dense and sparse vectors can be dotted) and the
    top MLP in one logit, so the Kaggle model 13-512-256-64-16 / 512-256-1 is
    ``bottom_mlp=[512, 256, 64]``, ``top_mlp=[512, 256]``.

    ``tower_module`` (``dlrm`` or ``dcn``) makes a DLRM a DMT-DLRM and a DCN a DMT-DCN
    (``distrec.models.dmt``): one tower module per tower of ``parallel.towers`` maps the
    tower's pooled embeddings to vectors of width D = ``tower_dim``, or, when that is unset, the D whose output is
    ``tower_compression`` x smaller than the tower's input; ``tower_c`` and ``tower_p`` are
    the DLRM tower's c and p, ``tower_cross_layers`` the DCN tower's cross layers,
    ``tower_interaction`` whether the DLRM tower's mixed outputs also read the tower's pairwise
    dot products (``distrec.models.tower_modules``).
    """

    preset: str = "dlrm-kaggle"
    arch: str = "dlrm"
    embedding_dim: int = 16
    bottom_mlp: list[int] = field(default_factory=lambda: [512, 256, 64])
    top_mlp: list[int] = field(default_factory=lambda: [512, 256])
    interaction: str = "dot"
    self_interaction: bool = False
    cross_layers: int = 3
    cross_low_rank: int = 0
    dcn_structure: str = "parallel"
    deep_mlp: list[int] = field(default_factory=lambda: [512, 256])
    tower_module: str | None = None
    tower_dim: int | None = None
    tower_compression: float = 4.0
    tower_c: int = 1
    tower_p: int = 1
    tower_cross_layers: int = 2
    tower_interaction: bool = False


@dataclass
class TrainConfig:
    """The optimisation loop.

    Unset fields take defaults that suit the data (``resolve_optimizers`` when the config
    loads; ``auto_batch_size`` and ``auto_eval_every`` when the trainer knows the rows):

    - ``optimizer`` unset: Adam for the dense layers and row-wise Adagrad for the embedding
      rows (``DEFAULT_SETUP``), each at its own default step. An ``optimizer`` set alone
      trains the embeddings with its sparse form, at ``lr`` unless ``embedding_lr`` is set.
    - ``lr`` unset: ``DEFAULT_LR`` of the dense optimizer.
    - ``epochs`` and ``max_steps`` unset: train until the validation AUC has not improved
      for ``patience`` evaluations (at most ``MAX_EPOCHS`` epochs), keep the best model in
      ``best/`` beside the last one in ``checkpoint/``.
    - ``batch_size`` unset: a power of two from the training rows (``auto_batch_size``).
    - ``eval_every`` 0: evaluate at the end only, or ``EVALS_PER_EPOCH`` times per epoch
      when training until the validation AUC stops improving.
    """

    epochs: int | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    eval_batch_size: int = 16384
    lr: float | None = None
    embedding_lr: float | None = None
    optimizer: str | None = None
    embedding_optimizer: str | None = None
    weight_decay: float = 0.0
    embedding_weight_decay: float = 0.0
    warmup_steps: int = 0
    decay: str = "none"
    decay_start_step: int = 0
    decay_steps: int = 0
    eval_every: int = 0
    patience: int = 5
    checkpoint_every: int = 0
    log_every: int = 50
    tensorboard: bool = False  # also write the metrics as TensorBoard scalars into RUN_DIR/tensorboard
    seed: int = 0
    threads: int = 0

    @property
    def until_converged(self) -> bool:
        """Whether the run's length is decided by early stopping (no epochs nor max_steps)."""
        return self.epochs is None and self.max_steps is None


DEFAULT_LR = {"sgd": 0.1, "adagrad": 0.01, "adam": 0.001}
"""Learning rate of each optimizer when ``train.lr`` is unset (SGD's is the DLRM reference's)."""

DEFAULT_SETUP = {"optimizer": "adam", "lr": DEFAULT_LR["adam"], "embedding_optimizer": "adagrad", "embedding_lr": 0.03}
"""The optimizers when none is chosen: Adam for the dense layers, row-wise Adagrad for the
embedding rows (both scale their steps by the gradients they see, so one setting learns on
data of any size; measured in docs/training.md, "Defaults")."""

MAX_EPOCHS = 100
"""Epochs at most when training until the validation AUC stops improving."""

EVALS_PER_EPOCH = 4
"""Evaluations per epoch when training until the validation AUC stops improving."""


def resolve_optimizers(t: TrainConfig) -> None:
    """Fill the unset optimizer fields of ``t`` (see TrainConfig) in place."""
    if t.optimizer is None:
        t.optimizer = DEFAULT_SETUP["optimizer"]
        if t.embedding_optimizer is None:
            t.embedding_optimizer = DEFAULT_SETUP["embedding_optimizer"]
            if t.embedding_lr is None and t.lr is None:
                t.embedding_lr = DEFAULT_SETUP["embedding_lr"]
    if t.lr is None and t.optimizer in DEFAULT_LR:
        t.lr = DEFAULT_LR[t.optimizer]


BATCHES_PER_EPOCH = 256
"""What ``auto_batch_size`` aims at: small data gets more, smaller steps per epoch."""


def auto_batch_size(train_rows: int) -> int:
    """The mini-batch when ``train.batch_size`` is unset: the largest power of two up to
    ``train_rows / BATCHES_PER_EPOCH``, within [64, 1024] (1024 is the DLRM reference's)."""
    target = max(1, train_rows // BATCHES_PER_EPOCH)
    return min(1024, max(64, 1 << (target.bit_length() - 1)))


def auto_eval_every(steps_per_epoch: int) -> int:
    """Steps between evaluations when training until the validation AUC stops improving."""
    return max(1, math.ceil(steps_per_epoch / EVALS_PER_EPOCH))


@dataclass
class ParallelConfig:
    """How a multi-process run splits the model (ignored in a single process).

    ``embeddings``: ``sharded`` splits the tables over the ranks by ``plan`` (a ShardingPlan
    JSON), by one ``sharding`` type for all tables, or by the greedy planner under
    ``memory_per_rank`` (a size such as '4GB'); ``local`` gives every rank its own full
    copy of the tables and all-reduces only dense gradients.

    ``lookup``: ``flat`` (one all-to-all over all ranks) or ``sptt`` (DMT's topology-aware
    exchange: tower t's tables on host t, ``tower_sharding`` table_wise, column_wise or
    row_wise over the host's ranks; ``towers`` is a tower partition JSON from ``distrec
    partition``, default the strided one). ``hosts`` x ``ranks_per_host``
    describe the topology (default: torchrun's WORLD_SIZE and LOCAL_WORLD_SIZE);
    ``hosts_per_tower`` K makes each tower span K hosts (hosts / K towers).

    ``replica_groups`` G > 1: 2D sparse parallelism (``distrec.parallel.two_d``): G groups of
    N / G consecutive ranks, the tables sharded within each group (the plan is for N / G
    ranks) and replicated across groups; ``replica_sync`` ``exact`` averages the touched
    rows' gradients across groups every step, ``periodic`` averages the replicas (weights and
    row-wise optimizer state) every ``sync_every`` steps, each row as ``replica_average``
    says: the mean over ``all`` groups, merged from the groups that ``touched`` it since the
    last sync, or ``auto`` (touched for Adagrad and Adam, all for SGD).
    ``timeout_seconds``: how long a collective waits for a silent rank before failing.
    """

    embeddings: str = "sharded"
    plan: str | None = None
    sharding: str | None = None
    memory_per_rank: str | None = None
    lookup: str = "flat"
    hosts: int | None = None
    ranks_per_host: int | None = None
    towers: str | None = None
    tower_sharding: str = "table_wise"
    hosts_per_tower: int = 1
    replica_groups: int = 1
    replica_sync: str = "exact"
    sync_every: int = 10
    replica_average: str = "auto"
    timeout_seconds: float = 600.0

    @property
    def tower_count(self) -> int | None:
        """Towers of the strided partition: hosts / hosts_per_tower (None without ``hosts``)."""
        return None if self.hosts is None else self.hosts // self.hosts_per_tower


@dataclass
class HotlineConfig:
    """Hotline (Adnan et al., ISCA 2024): hot embedding rows in a fast tier, the rest in a slow one.

    ``hot_budget``: fast-tier bytes for hot rows (weights, optimizer state, ids), e.g. '512MB'.
    ``sample_rate``: fraction of mini-batches the access logger counts. ``relearn_every``:
    mini-batches between re-selections of the hot set (the first window is the learning
    phase). ``logger_size``: the logger's memory (default: 4 MiB, whatever the budget, as the
    paper's; docs/hotline.md). ``slow_tier``: ``disk`` (a memory-mapped file), ``host`` (host memory, pinned
    for a GPU) or ``auto`` (host with a GPU, disk without); ``slow_tier_dir``: where the
    disk tier's file goes (default: the run's output directory). ``place_threads``: with a
    disk tier, run the step on CPUs that do not handle the disk's interrupts and the
    prefetch worker on those that do, when enough CPUs remain (``hotline/placement.py``).
    ``readahead``: a disk tier's gathers first start the reads of every page their rows
    touch, together (``hotline/readahead.py``); false: each page is read when the gather
    faults on it, as with a plain memory-mapped table (to measure what the readahead gains).
    ``slow_tier_file``: an existing file of every embedding row (float32, row-major, no
    header: [rows of all tables, dim + the embedding optimizer's per-row state]) used as the
    disk tier in place of a scratch file: training starts from its rows and writes into it
    (``hotline/tiers.py``, ``map_table_file``).
    """

    enabled: bool = False
    hot_budget: str = "512MB"
    sample_rate: float = 0.05
    relearn_every: int = 1000
    logger_size: str | None = None
    slow_tier: str = "auto"
    slow_tier_dir: str | None = None
    place_threads: bool = True
    readahead: bool = True
    slow_tier_file: str | None = None


@dataclass
class RunConfig:
    """A whole experiment."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    hotline: HotlineConfig = field(default_factory=HotlineConfig)


# Architecture presets. Sources: the DLRM reference code's run scripts
# (bench/dlrm_s_criteo_kaggle.sh, dlrm_s_criteo_terabyte.sh, MLPerf DLRM v1) and the
# DCN-v2 paper (Wang et al., WWW 2021) for `dcn`. The first bottom-MLP width and the last
# top-MLP width (13 and 1 in the papers) come from the data and the task, so they are left out.
PRESETS: dict[str, dict[str, Any]] = {
    "dlrm-kaggle": dict(arch="dlrm", embedding_dim=16, bottom_mlp=[512, 256, 64], top_mlp=[512, 256], interaction="dot"),
    "dlrm-terabyte": dict(arch="dlrm", embedding_dim=64, bottom_mlp=[512, 256], top_mlp=[512, 512, 256], interaction="dot"),
    "dlrm-mlperf": dict(arch="dlrm", embedding_dim=128, bottom_mlp=[512, 256], top_mlp=[1024, 1024, 512, 256], interaction="dot"),
    "dcn": dict(arch="dcn", embedding_dim=16, cross_layers=3, dcn_structure="parallel", deep_mlp=[512, 256], bottom_mlp=[]),
    "tiny": dict(arch="dlrm", embedding_dim=8, bottom_mlp=[16, 8], top_mlp=[16], interaction="dot"),
}

CHOICES: dict[str, tuple[str, ...]] = {
    "data.format": ("synthetic", "criteo", "movielens", "csv", "parquet"),
    "model.arch": ("dlrm", "dcn"),
    "model.interaction": ("dot", "cat"),
    "model.dcn_structure": ("parallel", "stacked"),
    "model.tower_module": ("dlrm", "dcn"),
    "train.optimizer": ("sgd", "adagrad", "adam"),
    "train.embedding_optimizer": ("sgd", "adagrad", "adam"),
    "train.decay": ("none", "linear", "cosine", "poly"),
    "parallel.embeddings": ("sharded", "local"),
    "parallel.lookup": ("flat", "sptt"),
    "parallel.tower_sharding": ("table_wise", "column_wise", "row_wise"),
    "parallel.sharding": ("table_wise", "column_wise", "row_wise", "data_parallel"),
    "parallel.replica_sync": ("exact", "periodic"),
    "parallel.replica_average": ("auto", "all", "touched"),
    "hotline.slow_tier": ("auto", "disk", "host"),
}


ROW_STATE_OPTIMIZERS = ("sgd", "adagrad")
"""Embedding optimizers whose state is per row, so a row can move between a shard and the
replicated hot table with it (lazy Adam's step count is per table)."""


@dataclass(frozen=True)
class Rule:
    """A combination of settings no parallel mode trains: ``refuses(cfg, world_size)`` (the
    world size is None while it is not known yet) -> the one-line ``message``."""

    refuses: Callable[[RunConfig, int | None], bool]
    message: str


def embedding_optimizer(cfg: RunConfig) -> str:
    """The optimizer of the embedding rows: ``train.embedding_optimizer``, else ``train.optimizer``."""
    return cfg.train.embedding_optimizer or cfg.train.optimizer


COMBINATION_RULES: list[Rule] = [
    Rule(
        lambda c, w: c.parallel.lookup == "sptt" and (c.parallel.embeddings != "sharded" or bool(c.parallel.plan) or bool(c.parallel.sharding)),
        "parallel.lookup sptt places the tables by tower itself; drop --embeddings local, --plan and --sharding",
    ),
    Rule(
        lambda c, w: w is not None and w > 1 and c.parallel.hosts_per_tower > 1 and c.parallel.lookup != "sptt", "--hosts-per-tower needs --lookup sptt; add it"
    ),
    Rule(lambda c, w: c.model.tower_module is not None and c.hotline.enabled, "--tower-module and --hotline cannot be combined; drop one of them"),
    Rule(
        lambda c, w: c.parallel.replica_groups > 1 and (c.parallel.embeddings != "sharded" or c.hotline.enabled),
        "--replica-groups (2D sparse parallelism) needs sharded embeddings, without --hotline; drop --embeddings local and --hotline",
    ),
    Rule(
        lambda c, w: c.parallel.replica_average != "auto" and c.parallel.replica_sync != "periodic",
        "--replica-average chooses how a periodic sync averages rows; add --replica-sync periodic or drop it",
    ),
    Rule(
        lambda c, w: w is not None and c.parallel.replica_groups > 1 and w % c.parallel.replica_groups != 0,
        "--replica-groups must divide the number of processes (each group has as many ranks); change it or --nproc-per-node",
    ),
    Rule(
        lambda c, w: w is not None and w > 1 and c.model.tower_module is not None and c.parallel.lookup != "sptt",
        "--tower-module in a multi-process run needs --lookup sptt (tower t on host t); add it",
    ),
    Rule(
        lambda c, w: c.hotline.enabled and bool(c.train.weight_decay or c.train.embedding_weight_decay),
        "train.weight_decay and train.embedding_weight_decay are not supported with --hotline yet; set them to 0",
    ),
    Rule(
        lambda c, w: c.hotline.enabled and w is not None and w > 1 and (c.parallel.embeddings != "sharded" or c.parallel.lookup == "sptt"),
        "distributed Hotline needs sharded embeddings and the flat all-to-all; drop --lookup sptt and --embeddings local",
    ),
    Rule(
        lambda c, w: c.hotline.enabled and w is not None and w > 1 and embedding_optimizer(c) not in ROW_STATE_OPTIMIZERS,
        f"distributed Hotline trains embeddings with {' or '.join(ROW_STATE_OPTIMIZERS)}; set train.embedding_optimizer to one of them",
    ),
]
"""Every combination of settings that no mode trains, with what to change: the one place
that says which techniques combine (``distrec.modes.select_mode`` adds the world size)."""


def check_combination(cfg: RunConfig, world_size: int | None = None) -> None:
    """Raise DistrecError naming the first of ``COMBINATION_RULES`` that refuses ``cfg``."""
    for rule in COMBINATION_RULES:
        if rule.refuses(cfg, world_size):
            raise DistrecError(rule.message)


def apply_preset(model: ModelConfig, name: str) -> None:
    """Overwrite the architecture fields of ``model`` with preset ``name``."""
    if name not in PRESETS:
        raise DistrecError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    model.preset = name
    for key, value in PRESETS[name].items():
        setattr(model, key, list(value) if isinstance(value, list) else value)


def to_dict(cfg: Any) -> dict:
    """The config as plain dicts and lists (for YAML/JSON)."""
    return dataclasses.asdict(cfg)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Convert a YAML/command-line value to the field's declared type, or fail clearly."""
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is None and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise DistrecError(f"config key {key!r} must be a mapping, got {value!r}")
        return _from_dict(hint, value, key + ".")
    if type(None) in args:  # Optional[...]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        inner = [a for a in args if a is not type(None)][0]
        return _coerce(value, inner, key)
    if origin is list:
        if isinstance(value, str):
            value = [v for v in value.replace("-", ",").split(",") if v.strip()] if value.strip() else []
        if not isinstance(value, list):
            raise DistrecError(f"config key {key!r} must be a list, got {value!r}")
        return [_coerce(v, args[0], key) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise DistrecError(f"config key {key!r} must be a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], key) for k, v in value.items()}
    try:
        if hint is bool:
            if isinstance(value, str):
                if value.lower() in ("true", "1", "yes", "on"):
                    return True
                if value.lower() in ("false", "0", "no", "off"):
                    return False
                raise ValueError
            return bool(value)
        if hint is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            if isinstance(value, str):
                value = float(value) if any(c in value for c in ".eE") else int(value)
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
            return int(value)
        if hint is float:
            return float(value)
        if hint is str:
            return str(value)
    except (TypeError, ValueError):
        raise DistrecError(f"config key {key!r} expects {getattr(hint, '__name__', hint)}, got {value!r}") from None
    return value


def _from_dict(cls: type, d: dict, prefix: str = "") -> Any:
    hints = get_type_hints(cls)
    unknown = set(d) - set(hints)
    if unknown:
        key = prefix + sorted(unknown)[0]
        raise DistrecError(f"unknown config key {key!r}; known keys under {prefix or 'top level'}: {', '.join(hints)}")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in d.items()}
    return cls(**kwargs)


def from_dict(d: dict) -> RunConfig:
    """Build and validate a RunConfig from nested dicts; missing fields take defaults."""
    d = dict(d or {})
    model = d.get("model") or {}
    preset = model.get("preset") if isinstance(model, dict) else None
    cfg = _from_dict(RunConfig, {k: v for k, v in d.items()})
    resolve_optimizers(cfg.train)
    if preset is not None:
        # the preset first, then any architecture field the file sets explicitly
        explicit = {k: getattr(cfg.model, k) for k in model if k != "preset"}
        apply_preset(cfg.model, preset)
        for k, v in explicit.items():
            setattr(cfg.model, k, v)
    validate(cfg)
    return cfg


def load(path: str | Path | None = None, overrides: list[str] | None = None, preset: str | None = None) -> RunConfig:
    """Load a YAML config (or the defaults), apply a preset, then ``key=value`` overrides."""
    d: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise DistrecError(f"config file {str(p)!r} not found; check the --config path")
        try:
            d = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as e:
            raise DistrecError(
                f"config file {str(p)!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); save it as UTF-8 YAML"
            ) from None
        except yaml.YAMLError as e:
            raise DistrecError(f"config file {str(p)!r} is not valid YAML ({str(e).splitlines()[0]}); fix its syntax") from None
        if not isinstance(d, dict):
            raise DistrecError(f"config file {str(p)!r} must hold a mapping of sections (data, model, train)")
    if preset is not None:
        d.setdefault("model", {})
        if not isinstance(d["model"], dict):
            raise DistrecError("config section 'model' must be a mapping")
        # a command-line preset replaces the file's architecture
        d["model"] = {"preset": preset}
    for item in overrides or []:
        set_value(d, item)
    return from_dict(d)


def set_value(d: dict, item: str) -> None:
    """Apply one ``section.field=value`` override to nested dicts (the value is YAML)."""
    if "=" not in item:
        raise DistrecError(f"override {item!r} must look like section.key=value, e.g. model.embedding_dim=64")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node = d
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise DistrecError(f"override {item!r}: {part!r} is not a section")
    node[parts[-1]] = value


def _non_finite(node: Any, prefix: str = "") -> tuple[str, float] | None:
    """The first float field (or list item) of a config section that is NaN or infinite, as (key, value)."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            found = _non_finite(value, key + ".")
            if found:
                return found
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                return key, item
    return None


def validate(cfg: RunConfig) -> None:
    """Check value ranges and choices; raise DistrecError naming the first bad field."""
    non_finite = _non_finite(cfg)
    if non_finite is not None:
        key, value = non_finite
        raise DistrecError(f"{key} is {value}; it must be a finite number")
    for key, choices in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value is not None and value not in choices:
            raise DistrecError(f"{key} is {value!r}; choose one of: {', '.join(choices)}")
    t, m, dc = cfg.train, cfg.model, cfg.data
    positive = {
        "train.batch_size": 1 if t.batch_size is None else t.batch_size,
        "train.eval_batch_size": t.eval_batch_size,
        "train.epochs": 1 if t.epochs is None else t.epochs,
        "train.patience": t.patience,
        "model.embedding_dim": m.embedding_dim,
        "data.max_ind_range": dc.max_ind_range,
        "data.chunk_rows": dc.chunk_rows,
        "data.synthetic.rows": dc.synthetic.rows,
        "data.synthetic.table_rows": dc.synthetic.table_rows,
        "data.synthetic.pooling_factor": dc.synthetic.pooling_factor,
        "parallel.replica_groups": cfg.parallel.replica_groups,
        "parallel.sync_every": cfg.parallel.sync_every,
    }
    for key, value in positive.items():
        if value < 1:
            raise DistrecError(f"{key} is {value}; it must be at least 1")
    if t.lr is None or t.lr <= 0:
        raise DistrecError(f"train.lr is {t.lr}; it must be positive")
    if t.max_steps is not None and t.max_steps < 1:
        raise DistrecError(f"train.max_steps is {t.max_steps}; it must be at least 1")
    for key in (
        "weight_decay",
        "embedding_weight_decay",
        "warmup_steps",
        "decay_start_step",
        "decay_steps",
        "eval_every",
        "checkpoint_every",
        "log_every",
        "threads",
    ):
        if getattr(t, key) < 0:
            raise DistrecError(f"train.{key} is {getattr(t, key)}; it must be 0 or more")
    for key in ("bottom_mlp", "top_mlp", "deep_mlp"):
        if any(w < 1 for w in getattr(m, key)):
            raise DistrecError(f"model.{key} is {getattr(m, key)}; every layer width must be at least 1")
    for name, rows in dc.table_sizes.items():
        if rows < 2:
            raise DistrecError(f"data.table_sizes.{name} is {rows}; a table needs at least 2 rows (row 0 is for missing values)")
    h = cfg.hotline
    parse_bytes(h.hot_budget, "hotline.hot_budget")
    if h.logger_size is not None:
        parse_bytes(h.logger_size, "hotline.logger_size")
    if not 0.0 < h.sample_rate <= 1.0:
        raise DistrecError(f"hotline.sample_rate is {h.sample_rate}; give a fraction of mini-batches in (0, 1], e.g. 0.05")
    if h.relearn_every < 0:
        raise DistrecError(f"hotline.relearn_every is {h.relearn_every}; give a number of mini-batches, 0 or more (0: never)")
    if cfg.parallel.memory_per_rank is not None:
        parse_bytes(cfg.parallel.memory_per_rank, "parallel.memory_per_rank")
    if m.tower_interaction and m.tower_module != "dlrm":
        raise DistrecError("model.tower_interaction feeds the DLRM tower module's mixed outputs; add --tower-module dlrm, or drop it")
    if m.tower_module is not None:
        if cfg.parallel.towers is None and cfg.parallel.hosts is None:
            raise DistrecError("--tower-module needs towers: pass --towers FILE from 'distrec partition' (or --hosts H for H strided towers)")
        if m.tower_compression <= 0 or (m.tower_dim is not None and m.tower_dim < 1):
            raise DistrecError("model.tower_compression must be positive and model.tower_dim at least 1; e.g. --compression 4")
    check_combination(cfg)
    if (cfg.parallel.hosts is None) != (cfg.parallel.ranks_per_host is None):
        raise DistrecError("give both --hosts and --ranks-per-host (or neither, to read them from torchrun)")
    if cfg.parallel.hosts_per_tower < 1 or cfg.parallel.hosts is not None and cfg.parallel.hosts % cfg.parallel.hosts_per_tower != 0:
        raise DistrecError(
            f"--hosts-per-tower {cfg.parallel.hosts_per_tower} must divide --hosts {cfg.parallel.hosts} (towers = hosts / K); change one of them"
        )
    if dc.format in ("csv", "parquet") and dc.schema is None and dc.path is not None:
        raise DistrecError(f"--data-format {dc.format} needs --schema FILE naming the label, dense and categorical columns")


def save(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    from distrec.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
