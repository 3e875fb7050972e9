"""Hybrid parallelism applied to a built model from the outside.

The model code (``distrec.models``) knows nothing of ranks; as with torchtitan's
``parallelize_*`` functions, this module takes a model built identically on every rank and
returns it ready for ``world_size`` processes:

- ``sharded`` embeddings: ``model.embeddings`` is replaced by a
  :class:`~distrec.parallel.sharded_embedding.ShardedEmbeddingBagCollection` holding this
  rank's shards of a :class:`~distrec.parallel.plan.ShardingPlan`, cut out of the model's own
  initial weights (the same on every rank, from the same seed), so a sharded run starts
  exactly where a single-process one does;
- ``local`` embeddings: every rank keeps its full tables and trains them on its own data
  shard only (the simple multi-node mode);
- dense layers: the whole model is wrapped in ``DistributedDataParallel`` with the embedding
  parameters excluded, so DDP all-reduces the dense gradients only.

Gradient scale: each rank's loss must be ``sum of its samples' losses / (B_global /
world_size)``; DDP's average over ranks then gives the dense gradients of the global mean
loss, and the sharded module's backward exchange scales the owners' gradients to match.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from distrec.config import ParallelConfig
from distrec.errors import DistrecError
from distrec.models.base import RecommendationModel
from distrec.parallel.default_plans import greedy_plan, uniform_plan
from distrec.parallel.plan import ShardingPlan
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection
from distrec.tables import TableConfig
from distrec.units import parse_bytes

EMBEDDING_MODES = ("sharded", "local")


def resolve_plan(tables: list[TableConfig], cfg: ParallelConfig, world_size: int) -> ShardingPlan:
    """The sharding plan of a run: ``cfg.plan`` (a JSON file), else one ``cfg.sharding`` type
    for every table, else the greedy table-wise plan under ``cfg.memory_per_rank``.

    Raises DistrecError when the plan does not fit the tables, the world size or the memory limit.
    """
    memory = parse_bytes(cfg.memory_per_rank, "parallel.memory_per_rank") if cfg.memory_per_rank else None
    if cfg.plan:
        plan = ShardingPlan.load(cfg.plan)
        if plan.world_size != world_size:
            raise DistrecError(
                f"sharding plan {cfg.plan!r} is for {plan.world_size} ranks but {world_size} are running; "
                f"launch {plan.world_size} processes or make a plan for {world_size} with 'distrec plan --devices {world_size}'"
            )
    elif cfg.sharding:
        plan = uniform_plan(tables, world_size, cfg.sharding)
    else:
        plan = greedy_plan(tables, world_size, memory)
    plan.validate(tables, memory)
    return plan


def parallelize_model(
    model: RecommendationModel,
    tables: list[TableConfig],
    mode: str,
    plan: ShardingPlan | None,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    embeddings: nn.Module | None = None,
) -> DistributedDataParallel:
    """Shard (or keep local) the embeddings of ``model``, move it to ``device``, wrap it in DDP.

    Args:
        model: built with the same seed on every rank (on the host). For ``sharded`` its
            embeddings may be built from one-row stand-ins of ``tables``
            (``distrec.tables.stand_in_tables``): each rank makes only its shards of the
            real tables, from the seed of ``model.embeddings.initializer``.
        tables: the model's tables, in feature order.
        mode: ``sharded`` (needs ``plan``) or ``local``.
        plan: the ShardingPlan for ``sharded``.
        device: this rank's device (its CUDA device under NCCL).
        group: the process group (default: the world).
        embeddings: an already distributed embedding module to use instead of sharding by
            ``plan`` (e.g. SPTT's, which shards by tower).

    Returns:
        The DDP-wrapped model; ``.module`` is the model itself, whose ``embeddings`` are sharded.
    """
    if mode not in EMBEDDING_MODES:
        raise DistrecError(f"parallel.embeddings is {mode!r}; choose one of: {', '.join(EMBEDDING_MODES)}")
    if embeddings is not None:
        model.embeddings = embeddings
    elif mode == "sharded":
        if plan is None:
            raise DistrecError("sharded embeddings need a sharding plan; pass --plan, --sharding or let the greedy planner make one")
        initializer = model.embeddings.initializer.for_tables(tables)
        model.embeddings = ShardedEmbeddingBagCollection.from_initializer(tables, plan, initializer, group, device)
    model.to(device)
    embedding_names = [f"embeddings.{name}" for name, _ in [*model.embeddings.named_parameters(), *model.embeddings.named_buffers()]]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, embedding_names)
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, process_group=group, gradient_as_bucket_view=True
    )


def embedding_divergence(embeddings: nn.Module, group: dist.ProcessGroup | None = None) -> float:
    """Root-mean-square distance of each rank's tables from the ranks' mean tables (float units).

    ``sqrt(mean over ranks of ||E_r - mean_r E_r||^2)`` over all table weights: 0 when every
    rank holds the same tables (a collective: every rank must call it).
    """
    world_size = dist.get_world_size(group)
    total = torch.zeros((), dtype=torch.float64)
    for p in embeddings.parameters():
        mean = p.detach().clone()
        dist.all_reduce(mean, group=group)
        mean /= world_size
        total += (p.detach() - mean).double().square().sum().cpu()
    total = total.to(next(embeddings.parameters()).device)
    dist.all_reduce(total, group=group)
    return float((total / world_size).sqrt())
