"""TorchRec's sharding planner (``EmbeddingShardingPlanner``) as a distrec planning algorithm.

TorchRec is an optional extra (``pip install distrec[torchrec]``) and is imported only when
this algorithm runs. Its planner gets the tables as an ``EmbeddingBagCollection`` on the meta
device, one device type (the accelerator, else the CPU) with ``memory_per_device`` bytes each,
the tables' pooling factors, and the sharding types distrec executes: table-wise, and
column-wise for tables that may be split (TorchRec's column shards are at least 128 columns
wide by default, so narrower tables stay whole). TorchRec's own storage estimate (weights,
optimizer state, buffers and a reserve) decides what fits, so it may need more memory than
distrec's heuristics, which count weight bytes only.
"""

from __future__ import annotations

import importlib

import torch

from distrec.errors import DistrecError
from distrec.parallel.plan import Shard, ShardingPlan, TablePlacement
from distrec.planner.types import PlanConstraints, TableSpec
from distrec.planner.workload import default_device

DISTREC_SHARDING = {
    "table_wise": "table_wise",
    "column_wise": "column_wise",
    "table_column_wise": "column_wise",
    "row_wise": "row_wise",
    "table_row_wise": "row_wise",
    "data_parallel": "data_parallel",
}
"""TorchRec's sharding type -> the distrec sharding type of the same shard layout."""

MAX_ERROR_CHARS = 120
"""Longest TorchRec error text quoted in a DistrecError."""


def placement_from_shards(table: TableSpec, sharding_type: str, shards: list[tuple[int, int, int, int, int]]) -> TablePlacement:
    """distrec's placement of ``table`` from TorchRec's sharding type and shards.

    Args:
        table: the table TorchRec placed.
        sharding_type: TorchRec's sharding type, e.g. ``"column_wise"``.
        shards: (rank, row_offset, num_rows, col_offset, num_cols) per shard, in rows and columns.

    A single shard covering the whole table becomes table-wise (as in ``emit.build_plan``).
    Raises DistrecError for sharding types or shard layouts distrec cannot run.

    Example:
        >>> t = TableSpec("a", 10, 8, 1.0, (1.0,) + (0.0,) * 16)
        >>> placement_from_shards(t, "column_wise", [(0, 0, 10, 0, 4), (1, 0, 10, 4, 4)]).shards[1]
        Shard(rank=1, row_start=0, row_end=10, col_start=4, col_end=8)
    """
    sharding = DISTREC_SHARDING.get(sharding_type)
    if sharding is None:
        raise DistrecError(f"TorchRec sharded table {table.name!r} {sharding_type}, which distrec cannot run; choose another --algorithm")
    placed = [Shard(rank, row, row + rows, col, col + cols) for rank, row, rows, col, cols in shards]
    all_rows = all(s.row_start == 0 and s.row_end == table.num_rows for s in placed)
    all_columns = all(s.col_start == 0 and s.col_end == table.dim for s in placed)
    fits = {
        "table_wise": len(placed) == 1 and all_rows and all_columns,
        "column_wise": all_rows,
        "row_wise": all_columns,
        "data_parallel": all_rows and all_columns,
    }
    if not placed or not fits[sharding]:
        raise DistrecError(
            f"TorchRec's {sharding_type} shards of table {table.name!r} do not form a distrec {sharding} placement; "
            "choose another --algorithm"
        )
    if sharding != "data_parallel" and len(placed) == 1 and all_rows and all_columns:
        sharding = "table_wise"
    return TablePlacement(table.name, sharding, placed)


def torchrec_plan(tables: list[TableSpec], devices: int, memory_per_device: int, constraints: PlanConstraints) -> ShardingPlan:
    """TorchRec's ``EmbeddingShardingPlanner`` plan of ``tables`` on ``devices`` ranks of ``memory_per_device`` bytes.

    No-split tables may only be table-wise; the others table- or column-wise. Pins are not
    supported (TorchRec's planner has no per-rank constraint). Raises DistrecError when
    TorchRec cannot be imported or finds no plan.
    """
    if constraints.pins:
        raise DistrecError(
            f"--algorithm torchrec cannot pin tables ({', '.join(sorted(constraints.pins))}); drop --pin or choose another --algorithm"
        )
    _import_torchrec()
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import PlannerError

    planner = EmbeddingShardingPlanner(
        topology=_topology(devices, memory_per_device), constraints=_parameter_constraints(tables, constraints)
    )
    try:
        result = planner.plan(module=_embedding_bags(tables), sharders=[EmbeddingBagCollectionSharder()])
    except PlannerError as e:
        raise DistrecError(
            f"TorchRec's planner found no plan for {devices} devices of {memory_per_device / 2**20:.1f} MiB "
            f"({_first_line(e)}); TorchRec also counts optimizer state and a reserve, so raise --memory-per-device or use more devices"
        ) from None
    by_table = {name: sharding for module_plan in result.plan.values() for name, sharding in module_plan.items()}
    missing = [t.name for t in tables if t.name not in by_table]
    if missing:
        raise DistrecError(f"TorchRec's planner left tables {missing} unplaced; choose another --algorithm")
    return ShardingPlan(devices, [placement_from_shards(t, by_table[t.name].sharding_type, _shards(by_table[t.name], t)) for t in tables])


def torchrec_available() -> bool:
    """Whether TorchRec's planner can be imported here (the optional torchrec extra works)."""
    try:
        _import_torchrec()
    except DistrecError:
        return False
    return True


def _import_torchrec() -> None:
    """Import TorchRec's planner, or raise the one-line DistrecError naming the install command."""
    try:
        for module in ("torchrec", "torchrec.distributed.embeddingbag", "torchrec.distributed.planner"):
            importlib.import_module(module)  # the sharders load fbgemm-gpu's kernels
    except Exception as e:  # a missing package, or a broken fbgemm-gpu .so (OSError, RuntimeError, ...)
        raise DistrecError(
            "--algorithm torchrec needs TorchRec and a matching fbgemm-gpu: pip install torchrec fbgemm-gpu-cpu "
            f"(import failed: {_first_line(e)})"
        ) from None


def _first_line(error: Exception) -> str:
    """``Type: first line of the message``, at most MAX_ERROR_CHARS characters."""
    lines = str(error).strip().splitlines()
    text = type(error).__name__ + (f": {lines[0]}" if lines else "")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _topology(devices: int, memory_per_device: int):
    """TorchRec's Topology: ``devices`` ranks of this machine's device type with ``memory_per_device`` bytes."""
    from torchrec.distributed.planner import Topology

    device_type = default_device().type
    memory = {"ddr_cap": memory_per_device} if device_type == "cpu" else {"hbm_cap": memory_per_device}
    try:
        return Topology(world_size=devices, compute_device=device_type, **memory)
    except AssertionError:  # how Topology rejects a device type it does not model
        raise DistrecError(f"TorchRec's planner does not support {device_type} devices; choose another --algorithm") from None


def _parameter_constraints(tables: list[TableSpec], constraints: PlanConstraints) -> dict:
    """TorchRec's ParameterConstraints per table name: sharding types, the fused kernel, pooling factor."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner import ParameterConstraints

    return {
        t.name: ParameterConstraints(
            sharding_types=["table_wise"] if t.name in constraints.no_split else ["table_wise", "column_wise"],
            compute_kernels=[EmbeddingComputeKernel.FUSED.value],  # weights on the device itself (no UVM)
            pooling_factors=[t.pooling_factor],
        )
        for t in tables
    }


def _embedding_bags(tables: list[TableSpec]):
    """The tables as a TorchRec EmbeddingBagCollection on the meta device (shapes only, no memory)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [EmbeddingBagConfig(name=t.name, num_embeddings=t.num_rows, embedding_dim=t.dim, feature_names=[t.name]) for t in tables]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def _shards(parameter_sharding, table: TableSpec) -> list[tuple[int, int, int, int, int]]:
    """(rank, row_offset, num_rows, col_offset, num_cols) of each shard of a TorchRec ParameterSharding."""
    if parameter_sharding.sharding_spec is None:  # data-parallel: a full replica on each rank
        return [(rank, 0, table.num_rows, 0, table.dim) for rank in parameter_sharding.ranks]
    return [
        (rank, meta.shard_offsets[0], meta.shard_sizes[0], meta.shard_offsets[1], meta.shard_sizes[1])
        for rank, meta in zip(parameter_sharding.ranks, parameter_sharding.sharding_spec.shards)
    ]
