"""Experiment configuration: typed sections with defaults, YAML files, presets, overrides.

One YAML file describes a run; every field has a default; ``--set section.field=value``
overrides any field from the command line. The resolved config is written into the run's
output folder so every result can be reproduced.

Each field carries its type (a ``Literal`` lists a choice field's values), its default and,
in the string right below it, what it is; ``distrec train``'s flags are made from these
(``distrec.cli.flags``). Each section checks its own values (``validate``);
``COMBINATION_RULES`` and ``validate`` check the settings that span sections.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from distrec.errors import DistrecError
from distrec.units import parse_bytes

Optimizer = Literal["sgd", "adagrad", "adam"]
"""An optimizer of ``distrec.components.optim``; the embeddings use its sparse, row-wise form."""

Arch = Literal["dlrm", "dcn"]
"""A model family: DLRM (Naumov et al., 2019) or DCN-v2 (Wang et al., WWW 2021)."""

TableDtype = Literal["fp32", "fp16", "bf16"]
"""How embedding rows are stored: float32, IEEE half (10-bit mantissa, largest 65504) or
bfloat16 (7-bit mantissa, float32's range)."""
TableSharding = Literal["table_wise", "column_wise", "row_wise"]
"""How a table is split over ranks: whole tables, column blocks or row blocks."""


def _check_min(key: str, value: int | float, minimum: int) -> None:
    """DistrecError naming ``key`` unless ``value`` is at least ``minimum`` (0 or 1)."""
    if value < minimum:
        raise DistrecError(f"{key} is {value}; it must be {'0 or more' if minimum == 0 else f'at least {minimum}'}")


@dataclass
class SyntheticConfig:
    """A Criteo-shaped synthetic data set (see ``distrec.data.synthetic``)."""

    rows: int = 200_000
    """Rows of the data set."""
    num_dense: int = 13
    """Dense features per row."""
    num_sparse: int = 26
    """Categorical features per row, one embedding table each."""
    table_rows: int = 100_000
    """Rows of each categorical feature's table (raw ids 1 to table_rows - 1; row 0 is for missing values)."""
    zipf_exponent: float = 1.05
    """Zipf exponent of the row popularity of every table: the larger, the more lookups the hottest rows take."""
    zipf_exponents: list[float] = field(default_factory=list)
    """One Zipf exponent per table, each 0 or more; empty: ``zipf_exponent`` for all."""
    pooling_factor: int = 1
    """Values per categorical feature and row (1: single-hot)."""
    interaction_groups: int = 0
    """G > 0: factorisation-machine interactions planted between the features of each of G random
    groups (the tower partitioner's ground truth); 0: none."""
    drift_period_rows: int = 0
    """Rows after which every table's hot rows move elsewhere (popularity drift); 0: no drift."""
    seed: int = 1234
    """Seed of the generator: row r depends only on the config and r."""
    fresh_each_epoch: bool = True
    """Training draws fresh rows every epoch after the first (draw e of each training row in
    epoch e, from the same planted model), as more real data would; the validation and test rows
    stay fixed. False: every epoch repeats the same rows, which a large model memorises."""

    def validate(self) -> None:
        """DistrecError naming the first field out of range."""
        for name in ("rows", "table_rows", "pooling_factor"):
            _check_min(f"data.synthetic.{name}", getattr(self, name), 1)


@dataclass
class DataConfig:
    """Where the data comes from and how it is split."""

    path: str | list[str] | None = None
    """Input: a file, a directory, a glob or several of them, local or URLs (s3://, gs://, hdfs://,
    file://; other schemes through fsspec); unset: synthetic data generated as ``data.synthetic`` says.

    Several files (Criteo's day_0.gz to day_23.gz, Parquet parts) are one data set, their rows in
    file order: a list in its order, a directory's or a glob's files in natural order (day_2 before
    day_10). Each file is prepared into its own cache, so a new file prepares only itself. A
    MovieLens input is one ml-100k directory."""
    format: Literal["synthetic", "criteo", "movielens", "csv", "parquet"] = "synthetic"
    """Input format: Criteo TSV (plain or compressed), a MovieLens ml-100k directory, CSV or Parquet
    read by ``schema``, or synthetic data."""
    schema: str | None = None
    """YAML schema of a csv or parquet input: its label, dense and categorical columns."""
    cache_dir: str | None = None
    """Where parsed data is cached; unset: $DISTREC_CACHE, else ~/.cache/distrec."""
    split: str = "random:0.1"
    """Holdout: random:VAL[:TEST] or last:VAL[:TEST], the fractions of the rows held out for
    validation and, optionally, test; or files:[VAL:]TEST, whole input files held out.

    ``random`` draws the held-out rows by a permutation seeded with ``train.seed``; ``last``
    holds out the last rows (a time-ordered holdout). ``files:T`` tests on the last T files and
    trains on the others without validation rows (as MLPerf trains on Criteo days 0-22 and tests
    on day 23); ``files:V:T`` also validates on the V files before them."""
    max_ind_range: int = 100_000
    """Rows per hashed table, for every feature that ``table_sizes`` does not name.

    Raw ids wrap into rows 1 to max_ind_range - 1 (row 0 is for missing values); a feature of
    small-integer ids (MovieLens') gets no more rows than its largest id."""
    table_sizes: dict[str, int] = field(default_factory=dict)
    """Rows of the tables of named features, e.g. {C1: 1000}, each at least 2."""
    strict: bool = False
    """Stop at the first malformed row instead of skipping it."""
    chunk_rows: int = 262_144
    """Rows parsed at a time while the input is read into the cache; a preparing process holds
    about this many rows (a part of a file waiting for the parts before it, up to twice)."""
    prepare_workers: int | None = None
    """Processes that prepare input files and parts of files at the same time; unset: one per
    CPU core this process may use."""
    loader_threads: int = 2
    """Threads that build mini-batches ahead of the training step, each a whole batch at a time."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    """The synthetic data set (format synthetic)."""

    def __post_init__(self) -> None:
        if isinstance(self.path, list) and len(self.path) == 1:  # --data FILE: one name, as before lists
            self.path = self.path[0]

    def validate(self) -> None:
        """DistrecError naming the first field out of range."""
        _check_min("data.max_ind_range", self.max_ind_range, 1)
        _check_min("data.chunk_rows", self.chunk_rows, 1)
        if self.prepare_workers is not None:
            _check_min("data.prepare_workers", self.prepare_workers, 1)
        _check_min("data.loader_threads", self.loader_threads, 1)
        if isinstance(self.path, list) and not self.path:
            raise DistrecError("data.path is an empty list; name at least one input file, or unset it for synthetic data")
        self.synthetic.validate()
        for name, rows in self.table_sizes.items():
            if rows < 2:
                raise DistrecError(f"data.table_sizes.{name} is {rows}; a table needs at least 2 rows (row 0 is for missing values)")
        if self.format in ("csv", "parquet") and self.schema is None and self.path is not None:
            raise DistrecError(f"--data-format {self.format} needs --schema FILE naming the label, dense and categorical columns")


@dataclass
class ModelConfig:
    """The architecture. A preset fixes these; input widths and table sizes come from data."""

    preset: str = "dlrm-kaggle"
    """Architecture preset (a name in ``PRESETS``) that sets the fields below unless they are given."""
    arch: Arch = "dlrm"
    """Model family: DLRM or DCN-v2."""
    embedding_dim: int = 16
    """Width of every embedding row, in floats."""
    table_dtype: TableDtype = "fp32"
    """How embedding rows are stored: fp32, or fp16 / bf16 for half the memory (pooled, differentiated
    and updated in float32, rounded stochastically when written; the optimizer's state stays float32)."""
    bottom_mlp: list[int] = field(default_factory=lambda: [512, 256, 64])
    """Hidden widths of DLRM's bottom MLP over the dense features.

    It always ends in a layer of width ``embedding_dim`` (so dense and sparse vectors can be
    dotted): the Kaggle model's 13-512-256-64-16 is [512, 256, 64]."""
    top_mlp: list[int] = field(default_factory=lambda: [512, 256])
    """Hidden widths of DLRM's top MLP over the interaction; it ends in one logit, so 512-256-1 is [512, 256]."""
    interaction: Literal["dot", "cat"] = "dot"
    """DLRM's feature interaction: the pairwise dot products of the vectors, or their concatenation."""
    self_interaction: bool = False
    """Dot interaction: also each vector's dot product with itself."""
    cross_layers: int = 3
    """DCN: cross layers."""
    cross_low_rank: int = 0
    """DCN: rank of each cross layer's matrix; 0: full rank."""
    dcn_structure: Literal["parallel", "stacked"] = "parallel"
    """DCN: the cross network and the deep MLP side by side (parallel) or the MLP after the cross network (stacked)."""
    deep_mlp: list[int] = field(default_factory=lambda: [512, 256])
    """DCN: hidden widths of the deep MLP."""
    tower_module: Arch | None = None
    """Tower module that compresses each tower's embeddings inside its host before they cross hosts;
    unset: none.

    One module per tower of ``parallel.towers`` (``distrec.models.dmt``) maps the tower's pooled
    embeddings to vectors of width D, making a DLRM a DMT-DLRM and a DCN a DMT-DCN
    (``distrec.models.tower_modules``)."""
    tower_dim: int | None = None
    """Width D of the tower modules' output vectors; unset: the D that makes a tower's output
    ``tower_compression`` times smaller than its input."""
    tower_compression: float = 4.0
    """About how many times fewer floats cross hosts (picks D when ``tower_dim`` is unset)."""
    tower_c: int = 1
    """DLRM tower module: outputs of width D per feature (the paper's c)."""
    tower_p: int = 1
    """DLRM tower module: outputs of width D mixing all features (the paper's p)."""
    tower_cross_layers: int = 2
    """DCN tower module: cross layers."""
    tower_interaction: bool = False
    """DLRM tower module: its mixed outputs also read the tower's pairwise dot products (hierarchical interaction)."""

    def validate(self) -> None:
        """DistrecError naming the first field out of range."""
        _check_min("model.embedding_dim", self.embedding_dim, 1)
        for key in ("bottom_mlp", "top_mlp", "deep_mlp"):
            if any(w < 1 for w in getattr(self, key)):
                raise DistrecError(f"model.{key} is {getattr(self, key)}; every layer width must be at least 1")
        if self.tower_interaction and self.tower_module != "dlrm":
            raise DistrecError("model.tower_interaction feeds the DLRM tower module's mixed outputs; add --tower-module dlrm, or drop it")
        if self.tower_module is not None and (self.tower_compression <= 0 or (self.tower_dim is not None and self.tower_dim < 1)):
            raise DistrecError("model.tower_compression must be positive and model.tower_dim at least 1; e.g. --compression 4")


@dataclass
class TrainConfig:
    """The optimisation loop. Unset fields take defaults that suit the data: the optimizers
    (``chosen_optimizers``), the batch size and evaluation interval once the trainer knows the
    rows (``auto_batch_size``, ``auto_eval_every``). The config keeps them unset; the run's
    resolved.json records what was chosen."""

    epochs: int | None = None
    """Passes over the training split (ignored when ``max_steps`` is set); unset, with ``max_steps``
    unset too: until the validation loss stops improving.

    Training until the loss stops improving ends after ``patience`` evaluations without a lower
    one, or after ``MAX_EPOCHS`` epochs, and keeps the best model in best/ beside the last one
    in checkpoint/."""
    max_steps: int | None = None
    """Optimizer steps in total, after which training stops."""
    batch_size: int | None = None
    """Global mini-batch size in samples; unset: from the training rows, 64 to 1024 (``auto_batch_size``)."""
    eval_batch_size: int = 16384
    """Evaluation mini-batch size in samples."""
    lr: float | None = None
    """Learning rate; unset: the optimizer's (sgd 0.1, adagrad 0.01, adam 0.001; ``DEFAULT_LR``)."""
    embedding_lr: float | None = None
    """Learning rate of the embedding rows; unset: ``lr``, or ``DEFAULT_SETUP``'s when neither
    ``optimizer`` nor ``lr`` is set."""
    optimizer: Optimizer | None = None
    """Optimizer; the embeddings get its sparse, row-wise form unless ``embedding_optimizer`` is set.
    Unset: adam for the dense layers, row-wise adagrad for the embeddings (``DEFAULT_SETUP``)."""
    embedding_optimizer: Optimizer | None = None
    """Optimizer of the embedding rows, in its sparse, row-wise form; unset: ``optimizer``'s."""
    weight_decay: float = 0.0
    """L2 penalty coefficient of the dense parameters."""
    embedding_weight_decay: float = 0.0
    """L2 penalty coefficient of the embedding rows a step touches."""
    warmup_steps: int = 0
    """Steps over which the learning rate rises linearly to ``lr``; 0: no warm-up."""
    decay: Literal["none", "linear", "cosine", "poly"] = "none"
    """Learning-rate decay to 0 from ``decay_start_step`` over ``decay_steps`` steps: linear, cosine,
    or poly ((1 - progress)^2, the DLRM reference's)."""
    decay_start_step: int = 0
    """Step at which the learning-rate decay starts."""
    decay_steps: int = 0
    """Steps the learning-rate decay lasts; 0: the run's total steps."""
    eval_every: int = 0
    """Steps between evaluations on the validation split, plus one at the end; 0: at the end, or
    four times per epoch (``EVALS_PER_EPOCH``) when training until the validation loss stops improving."""
    patience: int = 5
    """Without ``epochs`` and ``max_steps``: evaluations without a lower validation logloss before training stops."""
    checkpoint_every: int = 0
    """Steps between checkpoints, besides the one at the end and those by time; 0: none by step count."""
    checkpoint_minutes: float = 10.0
    """Minutes between checkpoints by time (a run killed outright loses at most this much);
    0: none by time. Ctrl-C and SIGTERM save one too, after the step in flight."""
    log_every: int = 50
    """Steps between records of the training loss and speed in the metrics log; 0: none."""
    tensorboard: bool = False
    """Also write the metrics, speed and time breakdown as TensorBoard scalars into the run's
    tensorboard/ folder (pip install 'distrec[tensorboard]')."""
    seed: int = 0
    """Random seed of the initial weights, the random split and the shuffling."""
    threads: int = 0
    """Torch's intra-op threads per process; 0: torch's default."""

    @property
    def until_converged(self) -> bool:
        """Whether the run's length is decided by early stopping (no epochs nor max_steps)."""
        return self.epochs is None and self.max_steps is None

    def validate(self) -> None:
        """DistrecError naming the first field out of range."""
        if self.batch_size is not None:
            _check_min("train.batch_size", self.batch_size, 1)
        _check_min("train.eval_batch_size", self.eval_batch_size, 1)
        if self.epochs is not None:
            _check_min("train.epochs", self.epochs, 1)
        _check_min("train.patience", self.patience, 1)
        for name in ("lr", "embedding_lr"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise DistrecError(f"train.{name} is {value}; it must be positive")
        if self.max_steps is not None:
            _check_min("train.max_steps", self.max_steps, 1)
        for name in (
            "weight_decay",
            "embedding_weight_decay",
            "warmup_steps",
            "decay_start_step",
            "decay_steps",
            "eval_every",
            "checkpoint_every",
            "checkpoint_minutes",
            "log_every",
            "threads",
        ):
            _check_min(f"train.{name}", getattr(self, name), 0)


DEFAULT_LR = {"sgd": 0.1, "adagrad": 0.01, "adam": 0.001}
"""Learning rate of each optimizer when ``train.lr`` is unset (SGD's is the DLRM reference's)."""

DEFAULT_SETUP = {"optimizer": "adam", "lr": DEFAULT_LR["adam"], "embedding_optimizer": "adagrad", "embedding_lr": 0.03}
"""The optimizers when none is chosen: Adam for the dense layers, row-wise Adagrad for the
embedding rows (both scale their steps by the gradients they see, so one setting learns on
data of any size; measured in benchmarks/results/2026-11-25-training-quality.md)."""

MAX_EPOCHS = 100
"""Epochs at most when training until the validation loss stops improving."""

EVALS_PER_EPOCH = 4
"""Evaluations per epoch when training until the validation loss stops improving."""


@dataclass(frozen=True)
class ChosenOptimizers:
    """The optimizers and learning rates a run trains with (``chosen_optimizers``)."""

    optimizer: Optimizer
    """Of the dense layers (and DMT's tower modules)."""
    lr: float
    embedding_optimizer: Optimizer
    """Of the embedding rows, in its sparse, row-wise form."""
    embedding_lr: float


def chosen_optimizers(t: TrainConfig) -> ChosenOptimizers:
    """The fields ``t`` sets, and for the unset ones the defaults ``TrainConfig`` describes;
    ``t`` itself stays as given (its config file says what the user chose)."""
    optimizer = t.optimizer or DEFAULT_SETUP["optimizer"]
    embedding = t.embedding_optimizer or (DEFAULT_SETUP["embedding_optimizer"] if t.optimizer is None else optimizer)
    lr = t.lr if t.lr is not None else DEFAULT_LR[optimizer]
    if t.embedding_lr is not None:
        embedding_lr = t.embedding_lr
    elif t.optimizer is None and t.embedding_optimizer is None and t.lr is None:
        embedding_lr = DEFAULT_SETUP["embedding_lr"]
    else:
        embedding_lr = lr
    return ChosenOptimizers(optimizer, lr, embedding, embedding_lr)


BATCHES_PER_EPOCH = 256
"""What ``auto_batch_size`` aims at: small data gets more, smaller steps per epoch."""


def auto_batch_size(train_rows: int) -> int:
    """The mini-batch when ``train.batch_size`` is unset: the largest power of two up to
    ``train_rows / BATCHES_PER_EPOCH``, within [64, 1024] (1024 is the DLRM reference's)."""
    target = max(1, train_rows // BATCHES_PER_EPOCH)
    return min(1024, max(64, 1 << (target.bit_length() - 1)))


def auto_eval_every(steps_per_epoch: int) -> int:
    """Steps between evaluations when training until the validation loss stops improving."""
    return max(1, math.ceil(steps_per_epoch / EVALS_PER_EPOCH))


@dataclass
class ParallelConfig:
    """How a multi-process run splits the model (ignored in a single process)."""

    embeddings: Literal["sharded", "local"] = "sharded"
    """sharded: the tables are split over the ranks (by ``plan``, ``sharding`` or the greedy planner);
    local: every rank keeps a full copy of the tables and all-reduces only dense gradients."""
    plan: str | None = None
    """Sharding plan JSON (from 'distrec plan'); unset: a greedy table-wise plan, saved with the run."""
    sharding: Literal[TableSharding, "data_parallel"] | None = None
    """Shard every table this way instead of planning."""
    memory_per_rank: str | None = None
    """Table memory limit per rank for the greedy planner, a size such as 4GB; unset: no limit."""
    lookup: Literal["flat", "sptt"] = "flat"
    """Embedding exchange: one all-to-all over all ranks (flat), or DMT's topology-aware SPTT by host (sptt)."""
    hosts: int | None = None
    """Hosts in the topology; unset: torchrun's WORLD_SIZE / LOCAL_WORLD_SIZE."""
    ranks_per_host: int | None = None
    """Ranks per host; unset: torchrun's LOCAL_WORLD_SIZE."""
    towers: str | None = None
    """With the sptt lookup: tower partition JSON from 'distrec partition', one tower per host (per
    ``hosts_per_tower`` hosts); unset: the strided partition.

    Tower t's tables live on host t."""
    tower_sharding: TableSharding = "table_wise"
    """With the sptt lookup: split a tower's tables over its host's ranks by table, by column, or by row for large tables."""
    hosts_per_tower: int = 1
    """With the sptt lookup: hosts each tower spans, so there are hosts / hosts_per_tower towers."""
    replica_groups: int = 1
    """2D sparse parallelism with G > 1: G groups of N/G consecutive ranks, each with every table
    sharded by a plan for N/G ranks; 1: plain sharding.

    The tables are replicated across the groups (``distrec.parallel.two_d``)."""
    replica_sync: Literal["exact", "periodic"] = "exact"
    """2D: exact averages the touched rows' gradients across groups every step; periodic averages
    the replicas (weights and row-wise optimizer state) every ``sync_every`` steps."""
    sync_every: int = 10
    """With the periodic replica sync: steps between replica averages."""
    replica_average: Literal["auto", "all", "touched"] = "auto"
    """With the periodic replica sync: a row's mean over all groups, or merged from the groups that
    touched it since the last sync; auto: touched for Adagrad and Adam, all for SGD."""
    timeout_seconds: float = 600.0
    """Seconds a collective waits for a silent rank before it fails, naming the rank."""

    @property
    def tower_count(self) -> int | None:
        """Towers of the strided partition: hosts / hosts_per_tower (None without ``hosts``)."""
        return None if self.hosts is None else self.hosts // self.hosts_per_tower

    def validate(self) -> None:
        """DistrecError naming the first field out of range or without its partner."""
        _check_min("parallel.replica_groups", self.replica_groups, 1)
        _check_min("parallel.sync_every", self.sync_every, 1)
        if self.memory_per_rank is not None:
            parse_bytes(self.memory_per_rank, "parallel.memory_per_rank")
        if (self.hosts is None) != (self.ranks_per_host is None):
            raise DistrecError("give both --hosts and --ranks-per-host (or neither, to read them from torchrun)")
        if self.hosts_per_tower < 1 or self.hosts is not None and self.hosts % self.hosts_per_tower != 0:
            raise DistrecError(f"--hosts-per-tower {self.hosts_per_tower} must divide --hosts {self.hosts} (towers = hosts / K); change one of them")


@dataclass
class HotlineConfig:
    """Hotline (Adnan et al., ISCA 2024): hot embedding rows in a fast tier, the rest in a slow one."""

    enabled: bool = False
    """Train with Hotline's hot set and micro-batch pipeline."""
    hot_budget: str = "512MB"
    """Fast-tier bytes for hot rows (weights, optimizer state, ids), a size such as 512MB."""
    sample_rate: float = 0.05
    """Fraction of mini-batches the access logger counts, in (0, 1]."""
    relearn_every: int = 1000
    """Mini-batches between re-selections of the hot set (the first window is the learning phase); 0: never."""
    logger_size: str | None = None
    """Memory of the access logger, a size such as 4MiB; unset: 4 MiB whatever the budget, as the paper's (docs/hotline.md)."""
    slow_tier: Literal["auto", "disk", "host"] = "auto"
    """Where the cold rows live: disk (a memory-mapped file), host (host memory, pinned for a GPU), or
    auto (host with a GPU, disk without)."""
    slow_tier_dir: str | None = None
    """Directory of the disk tier's file; unset: the run's output directory."""
    place_threads: bool = True
    """With a disk tier: run the step on CPUs that do not handle the disk's interrupts and the prefetch
    worker on those that do, when enough CPUs remain (``hotline/placement.py``)."""
    readahead: bool = True
    """With a disk tier: a gather first starts the reads of every page its rows touch, together
    (``hotline/readahead.py``); false: each page is read when the gather faults on it, as with a
    plain memory-mapped table (to measure what the readahead gains)."""
    slow_tier_file: str | None = None
    """An existing file of every embedding row used as the disk tier in place of a scratch file:
    training starts from its rows and writes into it; unset: a scratch file.

    Float32, row-major, no header: [rows of all tables, dim + the embedding optimizer's per-row
    state] (``hotline/tiers.py``, ``map_table_file``)."""

    def validate(self) -> None:
        """DistrecError naming the first field out of range."""
        parse_bytes(self.hot_budget, "hotline.hot_budget")
        if self.logger_size is not None:
            parse_bytes(self.logger_size, "hotline.logger_size")
        if not 0.0 < self.sample_rate <= 1.0:
            raise DistrecError(f"hotline.sample_rate is {self.sample_rate}; give a fraction of mini-batches in (0, 1], e.g. 0.05")
        if self.relearn_every < 0:
            raise DistrecError(f"hotline.relearn_every is {self.relearn_every}; give a number of mini-batches, 0 or more (0: never)")


@dataclass
class RunConfig:
    """A whole experiment."""

    data: DataConfig = field(default_factory=DataConfig)
    """The data set and its split."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The architecture."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The optimisation loop."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """How several processes split the model."""
    hotline: HotlineConfig = field(default_factory=HotlineConfig)
    """Hotline's fast and slow tiers."""


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
    """The optimizer of the embedding rows (``chosen_optimizers``)."""
    return chosen_optimizers(cfg.train).embedding_optimizer


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
        lambda c, w: c.parallel.sync_every != ParallelConfig.sync_every and c.parallel.replica_sync != "periodic",
        "--sync-every sets how often a periodic sync averages the replicas; add --replica-sync periodic or drop it",
    ),
    Rule(
        lambda c, w: c.parallel.replica_sync == "periodic" and c.parallel.replica_groups == 1,
        "--replica-sync periodic averages the replicas of replica groups, and the run has one group; add --replica-groups G (G > 1) or drop it",
    ),
    Rule(
        lambda c, w: bool(c.parallel.plan) and bool(c.parallel.sharding),
        "--plan places every table, so --sharding would be ignored; drop one of them",
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
that says which techniques combine (``distrec.parallel.spec.ParallelSpec.of`` adds the world size)."""


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


def unwrap_optional(hint: Any) -> Any:
    """The type inside ``X | None``; ``hint`` itself when it is not optional."""
    args = get_args(hint)
    if type(None) not in args:
        return hint
    return [a for a in args if a is not type(None)][0]


def takes_list(hint: Any) -> bool:
    """Whether a field of type ``hint`` may hold a list beside a single value (``str | list[str] | None``)."""
    members = [a for a in get_args(hint) if a is not type(None)]
    return len(members) > 1 and any(get_origin(a) is list for a in members)


def literal_values(hint: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` type (or ``Literal[...] | None``) allows; None for other types."""
    inner = unwrap_optional(hint)
    return get_args(inner) if get_origin(inner) is Literal else None


def _check_choice(value: Any, values: tuple[Any, ...], key: str) -> Any:
    """``value`` if it is one of ``values``, else DistrecError naming ``key`` and the choices."""
    if value not in values:
        raise DistrecError(f"{key} is {value!r}; choose one of: {', '.join(map(str, values))}")
    return value


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Convert a YAML/command-line value to the field's declared type, or fail clearly."""
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is None and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise DistrecError(f"config key {key!r} must be a mapping, got {value!r}")
        return _from_dict(hint, value, key + ".")
    if origin is Literal:
        return _check_choice(value, args, key)
    if type(None) in args and (value is None or (isinstance(value, str) and value.lower() in ("none", "null", ""))):  # Optional[...]
        return None
    members = [a for a in args if a is not type(None)]
    if len(members) > 1 and origin is not list and origin is not dict:  # a union such as str | list[str]: the member of the value's shape
        lists = [a for a in members if get_origin(a) is list]
        return _coerce(value, lists[0] if isinstance(value, list) and lists else next(a for a in members if get_origin(a) is not list), key)
    if type(None) in args:
        return _coerce(value, unwrap_optional(hint), key)
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
            if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
                raise ValueError  # YAML's true is no step count
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
    if preset is not None:
        # the preset first, then any architecture field the file sets explicitly
        explicit = {k: getattr(cfg.model, k) for k in model if k != "preset"}
        apply_preset(cfg.model, preset)
        for k, v in explicit.items():
            setattr(cfg.model, k, v)
    validate(cfg)
    return cfg


def read_file(path: str | Path) -> dict:
    """The sections of the YAML config file ``path``, as read (not yet checked against the fields)."""
    p = Path(path)
    if not p.is_file():
        raise DistrecError(f"config file {str(p)!r} not found; check the --config path")
    try:
        d = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise DistrecError(f"config file {str(p)!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); save it as UTF-8 YAML") from None
    except yaml.YAMLError as e:
        raise DistrecError(f"config file {str(p)!r} is not valid YAML ({str(e).splitlines()[0]}); fix its syntax") from None
    if not isinstance(d, dict):
        raise DistrecError(f"config file {str(p)!r} must hold a mapping of sections (data, model, train)")
    return d


def load(path: str | Path | None = None, overrides: list[str] | None = None, preset: str | None = None) -> RunConfig:
    """Load a YAML config (or the defaults), apply a preset, then ``key=value`` overrides."""
    d = read_file(path) if path is not None else {}
    if preset is not None:
        if d.get("model"):  # the preset would replace the section unread
            raise DistrecError(
                f"--preset {preset} replaces the architecture that config file {str(path)!r} sets in its model: section; "
                "drop --preset, or set model.preset in the file"
            )
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


def _check_field_types(node: Any, prefix: str = "") -> None:
    """DistrecError naming the first field of a config section (or list item) that is a NaN or
    infinite float, or a value its ``Literal`` type does not list."""
    hints = get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            _check_field_types(value, key + ".")
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                raise DistrecError(f"{key} is {item}; it must be a finite number")
        values = literal_values(hints[f.name])
        if values is not None and value is not None:
            _check_choice(value, values, key)


def validate(cfg: RunConfig) -> None:
    """Check value ranges and choices of each section, then the settings that span sections;
    raise DistrecError naming the first bad field."""
    _check_field_types(cfg)
    for section in (cfg.data, cfg.model, cfg.train, cfg.parallel, cfg.hotline):
        section.validate()
    if cfg.model.tower_module is not None and cfg.parallel.towers is None and cfg.parallel.hosts is None:
        raise DistrecError("--tower-module needs towers: pass --towers FILE from 'distrec partition' (or --hosts H for H strided towers)")
    check_combination(cfg)


def save(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    from distrec.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
