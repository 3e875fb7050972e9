"""Differentiable collectives and the process-group helpers the sharded modules share."""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from distrec.errors import DistrecError

DEFAULT_TIMEOUT_SECONDS = 600.0


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
            back.mul_(ctx.grad_scale)  # a fresh buffer: scaled where it lies
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


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group, grad_scale):
        ctx.group, ctx.grad_scale = group, grad_scale
        out = tensor.new_empty(tensor.shape[0] // dist.get_world_size(group), *tensor.shape[1:])
        _reduce_scatter_single(out, tensor.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty(grad.shape[0] * dist.get_world_size(ctx.group), *grad.shape[1:])
        _all_gather_single(back, grad.contiguous(), group=ctx.group)
        return back.mul_(ctx.grad_scale) if ctx.grad_scale != 1.0 else back, None, None


# the names from torch 2.13 on
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def differentiable_reduce_scatter(tensor: torch.Tensor, group: dist.ProcessGroup | None = None, grad_scale: float = 1.0) -> torch.Tensor:
    """Reduce-scatter (sum) along dim 0: group rank p gets block p of the sum of every rank's
    ``tensor`` (rows divisible by the group size). Its backward all-gathers the gradients,
    times ``grad_scale``."""
    return _ReduceScatter.apply(tensor, group, grad_scale)


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean of a 0-dim ``value`` over the ranks of the default group (a collective when
    there is one), as a Python float."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return float(value)


def free_port() -> int:
    """A TCP port on the loopback interface that nobody listens on right now."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA devices, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


NCCL_ERROR_HANDLING = "2"
"""``TORCH_NCCL_ASYNC_ERROR_HANDLING``: on a collective's error or timeout, abort the
communicators and raise in the training thread (where ``naming_silent_ranks`` turns it into
one line), instead of killing the process from NCCL's watchdog."""


def device_options(device: torch.device) -> dict[str, torch.device]:
    """Prepare this process for a group on ``device`` and return ``init_process_group``'s
    device options. On CUDA: make ``device`` (this rank's, ``cuda:LOCAL_RANK``) the current
    one before NCCL starts, so that NCCL, object collectives and synchronisations use it and
    not cuda:0 on every rank; bind the group to it (``device_id``); ask NCCL to raise its
    errors (``NCCL_ERROR_HANDLING``) unless the environment says otherwise."""
    if device.type != "cuda":
        return {}
    torch.cuda.set_device(device)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", NCCL_ERROR_HANDLING)
    return {"device_id": device}


def init_from_env(device: torch.device, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> tuple[int, int]:
    """Join the process group that torchrun (or a test) described in the environment.

    A collective waits at most ``timeout_seconds`` for the other ranks (see
    ``naming_silent_ranks``). Returns (rank, world size); (0, 1) without a distributed
    environment.
    """
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1 and "MASTER_ADDR" not in os.environ:
        return 0, 1
    if not timeout_seconds > 0:
        raise DistrecError(f"the collective timeout is {timeout_seconds} s; --timeout-seconds (parallel.timeout_seconds) must be positive")
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_seconds)
        store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
        # The elastic agent's store outlives a restart of the workers; keys of the killed
        # attempt (its ranks' addresses) must not be read by the next one, or it waits on them.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"distrec/attempt-{attempt}", store)
        dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world_size, timeout=timeout, **device_options(device))
    return dist.get_rank(), dist.get_world_size()


def leave_process_group() -> None:
    """After a run that succeeded on every rank: wait for all of them, then destroy the group.

    Not for a failing run: a rank that already died would never reach the barrier. A process
    that used a gloo group should then end with ``exit_without_finalizing``.
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_without_finalizing(status: int) -> NoReturn:
    """End this process now with ``status``, after flushing the logs and standard streams,
    without the interpreter's finalization.

    A gloo worker thread can still be releasing a finished collective's tensors when the
    interpreter finalizes; it then needs the GIL, and CPython (before 3.14, issue gh-87135)
    ends a thread that asks for the GIL during finalization with ``pthread_exit``, whose
    unwinding through a C++ destructor calls ``std::terminate``: SIGABRT, "terminate called
    without an active exception", after all the work was done. Seen in a core dump of a
    planner worker (``c10d::ProcessGroupGloo::runLoop`` destroying an all-gather's work in
    ``take_gil`` while the main thread ran ``Py_FinalizeEx``); skipping finalization avoids it.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _timed_out(error: BaseException) -> bool:
    """Whether ``error`` is a collective that gave up waiting for a peer (gloo's wording, or
    NCCL's watchdog: "Watchdog caught collective operation timeout")."""
    return isinstance(error, RuntimeError) and re.search(r"[Tt]imed out|[Tt]imeout", str(error)) is not None


def silent_ranks(wait_seconds: float) -> list[int] | None:
    """The ranks that do not check in within ``wait_seconds`` after a collective timed out.

    A timeout closes gloo's connections, so the ranks check in through the group's store
    (which the elastic agent or rank 0 keeps): every rank that is still running writes a
    key, and those whose key does not appear are the silent ones. None when the store cannot
    be reached.
    """
    prefix = "distrec/checked-in-after-timeout/"
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"{prefix}{dist.get_rank()}", "1")
        deadline = time.monotonic() + wait_seconds
        while True:
            missing = [r for r in range(dist.get_world_size()) if not store.check([f"{prefix}{r}"])]
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.1)
    except (RuntimeError, ValueError):  # the store is gone with its host
        return None


@contextmanager
def naming_silent_ranks(timeout_seconds: float) -> Iterator[None]:
    """Turn a collective that timed out inside the block into a one-line DistrecError naming
    the ranks that went silent (a hung, stopped or overloaded process)."""
    try:
        yield
    except RuntimeError as e:
        if not _timed_out(e) or not dist.is_initialized():
            raise
        silent = silent_ranks(min(timeout_seconds, 30.0))  # the healthy ranks time out within one timeout
        who = f"rank {', '.join(map(str, silent))}" if silent else "another rank"
        raise DistrecError(
            f"rank {dist.get_rank()} waited {timeout_seconds:g} s for {who}, which stopped taking part (hung, stopped or killed); "
            "end the job and resume it, or raise --timeout-seconds if that rank was only slow"
        ) from None
