"""Differentiable collectives and the process-group helpers the sharded modules share."""

from __future__ import annotations

import os
import socket
from contextlib import closing

import torch
import torch.distributed as dist


def all_to_all(
    tensor: torch.Tensor,
    output_splits: list[int],
    input_splits: list[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """``dist.all_to_all_single`` along dim 0 with variable splits (rows per peer); no autograd."""
    out = tensor.new_empty((sum(output_splits), *tensor.shape[1:]))
    dist.all_to_all_single(out, tensor.contiguous(), output_splits, input_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, output_splits, input_splits, group, grad_scale):
        ctx.splits = (output_splits, input_splits)
        ctx.group = group
        ctx.grad_scale = grad_scale
        return all_to_all(tensor, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        back = all_to_all(grad, input_splits, output_splits, ctx.group)
        if ctx.grad_scale != 1.0:
            back = back * ctx.grad_scale
        return back, None, None, None, None


def differentiable_all_to_all(
    tensor: torch.Tensor,
    output_splits: list[int],
    input_splits: list[int],
    group: dist.ProcessGroup | None = None,
    grad_scale: float = 1.0,
) -> torch.Tensor:
    """All-to-all whose backward sends the gradients back the same way, times ``grad_scale``.

    Rows ``input_splits[p]`` of ``tensor`` go to peer p; the result holds ``output_splits[p]``
    rows from each peer p, in peer order.
    """
    return _AllToAll.apply(tensor, list(output_splits), list(input_splits), group, grad_scale)


def free_port() -> int:
    """A TCP port on the loopback interface that nobody listens on right now."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA devices, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_from_env(device: torch.device) -> tuple[int, int]:
    """Join the process group that torchrun (or a test) described in the environment.

    Returns (rank, world size); (0, 1) without a distributed environment.
    """
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1 and "MASTER_ADDR" not in os.environ:
        return 0, 1
    if not dist.is_initialized():
        store, rank, world_size = next(dist.rendezvous("env://"))
        # The elastic agent's store outlives a restart of the workers; keys of the killed
        # attempt (its ranks' addresses) must not be read by the next one, or it waits on them.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(backend_for(device), store=dist.PrefixStore(f"distrec/attempt-{attempt}", store), rank=rank, world_size=world_size)
    return dist.get_rank(), dist.get_world_size()
