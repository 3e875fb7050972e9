"""TorchRec's sharding planner (``EmbeddingShardingPlanner``) as a distrec planning algorithm.

TorchRec is an optional extra (``benchmarks/setup_torchrec.sh`` installs the tested pair:
torchrec 1.8.0 with fbgemm-gpu-cpu 1.8.0) and is imported only when this algorithm runs.
Its planner gets the tables as an ``EmbeddingBagCollection`` on the meta device; a topology
from ``TopologyFactory`` of one device type (the accelerator, else the CPU) with
``memory_per_device`` bytes each; the per-rank batch size; the tables' pooling factors;
the fused kernel (weights on the device); and the sharding types distrec executes:
table-wise, and column-wise for tables that may be split.

Two choices differ from TorchRec's defaults, so that it plans the same problem as
distrec's other algorithms:

- ``memory_per_device`` is table memory, so no share of it is reserved for dense
  parameters and input batches (``FixedPercentageStorageReservation(0)`` in place of the
  default 15% plus a dense/KJT estimate). TorchRec's own storage estimate still decides
  what fits: on the CPU a shard costs its weights plus its input and output buffers for
  the batch; optimizer state counts only if the tables carry an optimizer class (these
  do not, and distrec's plan execution updates with SGD, which TorchRec counts as 0).
- Column shards: TorchRec cuts a column-wise table into blocks of ``min_partition``
  columns (default ``MIN_CW_DIM`` = 128, so tables of at most 128 columns never split);
  here a table's block is at least ``dim / devices`` columns (and a multiple of 4), so
  a table splits into at most ``devices`` shards, as NeuroShard's can.
"""

from __future__ import annotations

import importlib

import torch

from distrec.errors import DistrecError
from distrec.parallel.plan import ShardingPlan
from distrec.parallel.torchrec_format import distrec_plan_dict, torchrec_plan_dict
from distrec.planner.types import MIN_SHARD_DIM, PlanConstraints, TableSpec
from distrec.planner.workload import default_device

MAX_ERROR_CHARS = 120
"""Longest TorchRec error text quoted in a DistrecError."""

RESERVED_FRACTION = 0.0
"""Share of each device's memory TorchRec keeps for non-table use (its default is 0.15)."""

FIX = "choose another --algorithm"


def torchrec_plan(tables: list[TableSpec], devices: int, memory_per_device: int, constraints: PlanConstraints, batch_size: int | None = None) -> ShardingPlan:
    """TorchRec's ``EmbeddingShardingPlanner`` plan of ``tables`` on ``devices`` ranks of ``memory_per_device`` bytes.

    Args:
        tables: the tables with their pooling factors.
        devices: number of ranks.
        memory_per_device: table bytes per rank (TorchRec's estimate must fit in it).
        constraints: no-split tables may only be table-wise; pins are refused (TorchRec's
            planner has no per-rank constraint).
        batch_size: samples per training step over all ranks (TorchRec gets
            ``batch_size // devices`` per rank); None = TorchRec's default per-rank batch.

    Raises DistrecError when TorchRec cannot be imported or finds no plan.
    """
    if constraints.pins:
        raise DistrecError(f"--algorithm torchrec cannot pin tables ({', '.join(sorted(constraints.pins))}); drop --pin or {FIX}")
    require_torchrec()
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import PlannerError

    planner = EmbeddingShardingPlanner(
        topology=_topology(devices, memory_per_device),
        batch_size=max(1, batch_size // devices) if batch_size else None,
        storage_reservation=FixedPercentageStorageReservation(RESERVED_FRACTION),
        constraints=_parameter_constraints(tables, devices, constraints),
        stats=[],  # no plan statistics printed
        debug=False,
    )
    try:
        result = planner.plan(module=_embedding_bags(tables), sharders=[EmbeddingBagCollectionSharder()])
    except PlannerError as e:
        raise DistrecError(
            f"TorchRec's planner found no plan for {devices} devices of {memory_per_device / 2**20:.1f} MiB "
            f"({_first_line(e)}); TorchRec also counts input and output buffers, so raise --memory-per-device or use more devices"
        ) from None
    plan = ShardingPlan.from_dict(distrec_plan_dict(torchrec_plan_dict(result, devices), fix=FIX))
    missing = sorted({t.name for t in tables} - {p.table for p in plan.tables})
    if missing:
        raise DistrecError(f"TorchRec's planner left tables {missing} unplaced; {FIX}")
    return plan


def torchrec_available() -> bool:
    """Whether TorchRec's planner can be imported here (the optional torchrec extra works)."""
    return torchrec_version() is not None


def torchrec_version() -> str | None:
    """The version of TorchRec where its planner imports, else None."""
    try:
        require_torchrec()
    except DistrecError:
        return None
    return getattr(importlib.import_module("torchrec"), "__version__", "unknown")


def require_torchrec() -> None:
    """Import TorchRec's planner, or raise the one-line DistrecError naming the install command."""
    try:
        for module in ("torchrec", "torchrec.distributed.embeddingbag", "torchrec.distributed.planner"):
            importlib.import_module(module)  # the sharders load fbgemm-gpu's kernels
    except Exception as e:  # a missing package, or a broken fbgemm-gpu .so (OSError, RuntimeError, ...)
        raise DistrecError(
            "--algorithm torchrec needs TorchRec and its matching fbgemm-gpu (with torch 2.13: pip install fbgemm-gpu-cpu==1.8.0, "
            f"then pip install --no-deps torchrec==1.8.0, as benchmarks/setup_torchrec.sh does; import failed: {_first_line(e)})"
        ) from None


def _first_line(error: Exception) -> str:
    """``Type: first line of the message``, at most MAX_ERROR_CHARS characters."""
    lines = str(error).strip().splitlines()
    text = type(error).__name__ + (f": {lines[0]}" if lines else "")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _topology(devices: int, memory_per_device: int):
    """TorchRec's Topology: ``devices`` ranks of this machine's device type with ``memory_per_device`` bytes."""
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

    device_type = default_device().type
    memory = {"ddr_cap_bytes": memory_per_device} if device_type == "cpu" else {"hbm_cap_bytes": memory_per_device}
    try:
        return TopologyFactory.create_topology(TrainerConfig(world_size=devices, **memory), kernel_config=KernelConfig(compute_device=device_type))
    except (ValueError, AssertionError):  # how its configs reject a device type TorchRec does not model
        raise DistrecError(f"TorchRec's planner does not support {device_type} devices; {FIX}") from None


def _parameter_constraints(tables: list[TableSpec], devices: int, constraints: PlanConstraints) -> dict:
    """TorchRec's ParameterConstraints per table name: sharding types, the fused kernel,
    pooling factor, and column blocks of at least dim / devices columns."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner import ParameterConstraints

    return {
        t.name: ParameterConstraints(
            sharding_types=["table_wise"] if t.name in constraints.no_split else ["table_wise", "column_wise"],
            compute_kernels=[EmbeddingComputeKernel.FUSED.value],  # weights on the device itself (no UVM)
            min_partition=max(MIN_SHARD_DIM, t.dim // devices),
            pooling_factors=[t.pooling_factor],
        )
        for t in tables
    }


def _embedding_bags(tables: list[TableSpec]):
    """The tables as a TorchRec EmbeddingBagCollection on the meta device (shapes only, no memory)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [EmbeddingBagConfig(name=t.name, num_embeddings=t.num_rows, embedding_dim=t.dim, feature_names=[t.name]) for t in tables]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
