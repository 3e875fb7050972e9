"""TorchRec's sharding plan as JSON, and its conversion to and from distrec's plan format.

TorchRec's ``ShardingPlan`` maps a module's path (as ``DistributedModelParallel`` names it,
e.g. ``"sparse_arch.embedding_bag_collection"``) to a ``ParameterSharding`` per table. The
JSON form keeps those fields and adds the world size, which TorchRec's plan does not hold,
and the [rows, dim] of data-parallel tables, whose TorchRec sharding has no shards::

    {"world_size": 2,
     "shapes": {"t1": [50, 4]},
     "plan": {"sparse_arch.embedding_bag_collection": {
        "t0": {"sharding_type": "column_wise", "compute_kernel": "fused", "ranks": [0, 1],
               "sharding_spec": [{"shard_offsets": [0, 0], "shard_sizes": [100, 8], "placement": "rank:0/cpu"},
                                 {"shard_offsets": [0, 8], "shard_sizes": [100, 8], "placement": "rank:1/cpu"}]},
        "t1": {"sharding_type": "data_parallel", "compute_kernel": "dense", "ranks": [0, 1], "sharding_spec": null}}}}

``distrec plan --format torchrec`` writes it; ``--plan`` reads it (``ShardingPlan.load``).
A plan TorchRec's planner made is saved in this form by the snippet in
docs/neuroshard-vs-torchrec.md, or by ``torchrec_plan_dict``. ``torchrec_sharding_plan``
builds the TorchRec objects ``DistributedModelParallel(plan=...)`` takes (needs TorchRec).

The conversions work on distrec's plan as a dict (``ShardingPlan.to_dict`` / ``from_dict``),
so that ``distrec.parallel.plan`` can use this module without an import cycle.
"""

from __future__ import annotations

from typing import Any

from distrec.errors import DistrecError

DISTREC_SHARDING = {
    "table_wise": "table_wise",
    "column_wise": "column_wise",
    "table_column_wise": "column_wise",
    "row_wise": "row_wise",
    "table_row_wise": "row_wise",
    "data_parallel": "data_parallel",
}
"""TorchRec's sharding type -> the distrec sharding type of the same shard layout."""

COMPUTE_KERNEL = {"data_parallel": "dense"}
"""TorchRec's compute kernel per distrec sharding type: the fused lookup + optimizer kernel
(weights on the device) for sharded tables, the dense kernel for data-parallel replicas."""
FUSED_KERNEL = "fused"

DEFAULT_MODULE = "sparse_arch.embedding_bag_collection"
"""Where TorchRec's DLRM (``torchrec.models.dlrm.DLRM``) keeps its EmbeddingBagCollection."""


def is_torchrec_plan(document: object) -> bool:
    """Whether a loaded JSON document is a TorchRec plan (has ``plan``) rather than distrec's (``tables``)."""
    return isinstance(document, dict) and "plan" in document and "tables" not in document


def placement_from_shards(table: str, sharding_type: str, shards: list[tuple[int, int, int, int, int]], fix: str) -> dict:
    """distrec's placement of ``table`` (a ``ShardingPlan.to_dict`` entry) from TorchRec's sharding type and shards.

    Args:
        table: the table's name.
        sharding_type: TorchRec's sharding type, e.g. ``"column_wise"``.
        shards: (rank, row_offset, num_rows, col_offset, num_cols) per shard.
        fix: what the user should do if distrec cannot run the layout (ends error messages).

    The table's shape is the shards' extent (``ShardingPlan.validate`` checks it against
    the model). A single shard becomes table-wise. Raises DistrecError for sharding types
    or layouts distrec cannot run.

    Example:
        >>> placement_from_shards("a", "column_wise", [(0, 0, 10, 0, 4), (1, 0, 10, 4, 4)], "fix it")["shards"][1]
        {'rank': 1, 'row_start': 0, 'row_end': 10, 'col_start': 4, 'col_end': 8}
    """
    sharding = DISTREC_SHARDING.get(sharding_type)
    if sharding is None:
        raise DistrecError(f"TorchRec sharded table {table!r} {sharding_type}, which distrec cannot run; {fix}")
    placed = [{"rank": rank, "row_start": row, "row_end": row + rows, "col_start": col, "col_end": col + cols} for rank, row, rows, col, cols in shards]
    if not placed:
        raise DistrecError(f"TorchRec's plan gives table {table!r} no shards; {fix}")
    num_rows, dim = max(s["row_end"] for s in placed), max(s["col_end"] for s in placed)
    all_rows = all(s["row_start"] == 0 and s["row_end"] == num_rows for s in placed)
    all_columns = all(s["col_start"] == 0 and s["col_end"] == dim for s in placed)
    fits = {
        "table_wise": len(placed) == 1,
        "column_wise": all_rows,
        "row_wise": all_columns,
        "data_parallel": all_rows and all_columns,
    }
    if not fits[sharding]:
        raise DistrecError(f"TorchRec's {sharding_type} shards of table {table!r} do not form a distrec {sharding} placement; {fix}")
    if sharding != "data_parallel" and len(placed) == 1:
        sharding = "table_wise"
    return {"table": table, "sharding": sharding, "shards": placed}


def distrec_plan_dict(document: dict, fix: str = "save TorchRec's plan with the snippet in docs/neuroshard-vs-torchrec.md") -> dict:
    """distrec's plan (the ``ShardingPlan.to_dict`` form) of a TorchRec plan in the JSON form (see the module doc).

    Tables of every module are placed by name; ``fix`` ends the one-line DistrecErrors.
    """
    try:
        world_size = int(document["world_size"])
        shapes = document.get("shapes") or {}
        placements = []
        for tables in document["plan"].values():
            for name, sharding in tables.items():
                placements.append(placement_from_shards(name, sharding["sharding_type"], _shards(name, sharding, shapes, fix), fix))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DistrecError(f"TorchRec plan is malformed ({type(e).__name__}: {e}); {fix}") from None
    names = [p["table"] for p in placements]
    if len(set(names)) != len(names):
        raise DistrecError(
            f"TorchRec plan places a table name in two modules ({sorted({n for n in names if names.count(n) > 1})}); distrec needs unique table names; {fix}"
        )
    return {"world_size": world_size, "tables": placements}


def torchrec_dict_from_plan(plan: dict, module: str = DEFAULT_MODULE, device: str = "cpu") -> dict:
    """The TorchRec JSON form of a distrec plan (``ShardingPlan.to_dict``): every table under
    ``module``, shards on ``device`` ("cpu" or "cuda")."""
    replicated = [p for p in plan["tables"] if p["sharding"] == "data_parallel"]
    return {
        "world_size": plan["world_size"],
        "shapes": {p["table"]: [p["shards"][0]["row_end"], p["shards"][0]["col_end"]] for p in replicated},
        "plan": {module: {p["table"]: _parameter_sharding(p, device) for p in plan["tables"]}},
    }


def torchrec_plan_dict(plan: Any, world_size: int, shapes: dict[str, list[int]] | None = None) -> dict:
    """The JSON form of TorchRec's ``ShardingPlan`` (what ``EmbeddingShardingPlanner.plan`` returns);
    ``shapes`` gives [rows, dim] of tables it may make data-parallel."""
    return {
        "world_size": world_size,
        "shapes": shapes or {},
        "plan": {
            module: {
                table: {
                    "sharding_type": ps.sharding_type,
                    "compute_kernel": ps.compute_kernel,
                    "ranks": list(ps.ranks),
                    "sharding_spec": None
                    if ps.sharding_spec is None
                    else [
                        {"shard_offsets": list(s.shard_offsets), "shard_sizes": list(s.shard_sizes), "placement": str(s.placement)}
                        for s in ps.sharding_spec.shards
                    ],
                }
                for table, ps in module_plan.items()
            }
            for module, module_plan in plan.plan.items()
        },
    }


def torchrec_sharding_plan(document: dict) -> Any:
    """TorchRec's ``ShardingPlan`` of the JSON form, for ``DistributedModelParallel(plan=...)`` (needs TorchRec)."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding
    from torchrec.distributed.types import ShardingPlan as TorchRecShardingPlan

    def spec(shards: list[dict] | None):
        if shards is None:
            return None
        return EnumerableShardingSpec([ShardMetadata(s["shard_offsets"], s["shard_sizes"], s["placement"]) for s in shards])

    return TorchRecShardingPlan(
        {
            module: EmbeddingModuleShardingPlan(
                {
                    table: ParameterSharding(
                        sharding_type=ps["sharding_type"],
                        compute_kernel=ps["compute_kernel"],
                        ranks=list(ps["ranks"]),
                        sharding_spec=spec(ps["sharding_spec"]),
                    )
                    for table, ps in tables.items()
                }
            )
            for module, tables in document["plan"].items()
        }
    )


def _parameter_sharding(p: dict, device: str) -> dict:
    """TorchRec's ParameterSharding fields of one distrec placement (a ``ShardingPlan.to_dict`` entry)."""
    if p["sharding"] == "data_parallel":
        return {
            "sharding_type": "data_parallel",
            "compute_kernel": COMPUTE_KERNEL["data_parallel"],
            "ranks": [s["rank"] for s in p["shards"]],
            "sharding_spec": None,
        }
    shards = sorted(p["shards"], key=lambda s: (s["row_start"], s["col_start"]))  # TorchRec orders shards by offset
    return {
        "sharding_type": p["sharding"],
        "compute_kernel": FUSED_KERNEL,
        "ranks": [s["rank"] for s in shards],
        "sharding_spec": [
            {
                "shard_offsets": [s["row_start"], s["col_start"]],
                "shard_sizes": [s["row_end"] - s["row_start"], s["col_end"] - s["col_start"]],
                "placement": _placement(s["rank"], device),
            }
            for s in shards
        ],
    }


def _placement(rank: int, device: str) -> str:
    """TorchRec's shard placement string: ``rank:0/cpu``, ``rank:3/cuda:3``."""
    return f"rank:{rank}/cpu" if device == "cpu" else f"rank:{rank}/{device}:{rank}"


def _shards(name: str, sharding: dict, shapes: dict, fix: str) -> list[tuple[int, int, int, int, int]]:
    """(rank, row_offset, num_rows, col_offset, num_cols) of each shard of one table's ParameterSharding fields.

    A data-parallel table has no sharding spec in TorchRec: a full replica on each of its
    ranks, of the shape the document's ``shapes`` gives.
    """
    if sharding["sharding_spec"] is None:
        if name not in shapes:
            raise DistrecError(f'TorchRec plan replicates table {name!r} but gives no shape for it; add "shapes": {{"{name}": [rows, dim]}}; {fix}')
        rows, dim = (int(x) for x in shapes[name])
        return [(int(rank), 0, rows, 0, dim) for rank in sharding["ranks"]]
    return [
        (int(rank), int(s["shard_offsets"][0]), int(s["shard_sizes"][0]), int(s["shard_offsets"][1]), int(s["shard_sizes"][1]))
        for rank, s in zip(sharding["ranks"], sharding["sharding_spec"], strict=True)
    ]
