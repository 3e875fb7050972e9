"""The pieces of hybrid parallelism the modes share: the run's sharding plan, data-parallel
dense layers, and how far local tables drift apart.

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
from distrec.parallel.default_plans import greedy_plan, uniform_plan
from distrec.parallel.plan import ShardingPlan
from distrec.tables import TableConfig
from distrec.units import parse_bytes


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


def dense_data_parallel(model: nn.Module, device: torch.device, group: dist.ProcessGroup | None = None) -> DistributedDataParallel:
    """``model`` (on ``device``) in DDP with its embedding parameters and buffers excluded, so
    DDP all-reduces the dense gradients only; ``.module`` is the model itself.

    Non-persistent buffers (index maps computed from the architecture, such as the dot
    interaction's pair positions) are excluded too: every rank builds them equal, and DDP
    would otherwise broadcast them from rank 0 before every forward, one more collective
    (and one more wait for the slowest rank) per step."""
    embedding_names = [f"embeddings.{name}" for name, _ in [*model.embeddings.named_parameters(), *model.embeddings.named_buffers()]]
    derived_buffers = [f"{prefix}.{name}" if prefix else name for prefix, module in model.named_modules() for name in module._non_persistent_buffers_set]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, embedding_names + derived_buffers)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None, process_group=group, gradient_as_bucket_view=True)


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
