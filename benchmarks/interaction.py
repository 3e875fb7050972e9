"""DLRM's dot interaction and dense layers, forward + backward: distrec's against plain PyTorch.

For one batch of the TorchRec comparison's workload (``vs_torchrec.py``: 2,048 samples, 26 sparse vectors of dim 64, bottom MLP
13-512-256-64, top MLP 415-512-256-1), times in one process, alternating in rounds:

- ``interaction``: ``distrec.models.interaction.DotInteraction`` (its compiled kernels on the
  CPU) against the interaction as a new PyTorch user writes it (a batched product of the
  [27, 64] vector matrix with itself, then an index of the upper triangle, autograd's own
  backward);
- ``dense``: the whole dense part of a step (bottom MLP, interaction, top MLP, forward and
  backward) with each interaction, the MLPs shared.

Both interactions give the same output and gradients to float32 rounding (checked here too).
Medians in ms per thread count; the last line is the harness's result record (one system per
part, thread count and interaction, its time per round), with ``ms`` and ``speedup``.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/interaction.py                 # 1 and 2 threads
    OMP_WAIT_POLICY=PASSIVE python benchmarks/interaction.py --threads 1 --rounds 5
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

import harness
from distrec.models.interaction import DotInteraction
from distrec.models.mlp import mlp


class PlainDotInteraction(nn.Module):
    """The baseline: ``[x, upper triangle of V V^T]`` for V = [x, e_1, ..., e_F], autograd's backward."""

    def __init__(self, num_sparse: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_sparse + 1, num_sparse + 1, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        vectors = torch.cat([dense.unsqueeze(1), sparse], dim=1)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))
        return torch.cat([dense, gram[:, self.rows, self.cols]], dim=1)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2048, help="samples")
    p.add_argument("--sparse", type=int, default=26, help="sparse vectors per sample")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per round and system (default 10)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.threads) < 1 or args.rounds < 1 or args.repeats < 1:
        p.error("--threads, --rounds and --repeats must be positive")

    torch.manual_seed(args.seed)
    dense_in = torch.randn(args.batch, 13)
    sparse = torch.randn(args.batch, args.sparse, args.dim, requires_grad=True)
    bottom = mlp([13, 512, 256, args.dim], final_activation=True)
    interactions = {"distrec": DotInteraction(args.sparse), "plain": PlainDotInteraction(args.sparse)}
    top = mlp([interactions["distrec"].output_width(args.dim), 512, 256, 1])

    upstream = torch.randn(args.batch, interactions["distrec"].output_width(args.dim))
    outputs = {}
    for name, module in interactions.items():
        x = torch.randn(args.batch, args.dim, generator=torch.Generator().manual_seed(1)).requires_grad_()
        out = module(x, sparse)
        outputs[name] = (out.detach(), *torch.autograd.grad((out * upstream).sum(), [x, sparse]))
    for got, want in zip(outputs["distrec"], outputs["plain"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    x_alone = torch.randn(args.batch, args.dim, requires_grad=True)

    def interaction_step(module: nn.Module) -> Callable[[], None]:
        return lambda: module(x_alone, sparse).backward(upstream)

    def dense_step(module: nn.Module) -> Callable[[], None]:
        return lambda: top(module(bottom(dense_in), sparse)).sum().backward()

    def timed(make: Callable[[nn.Module], Callable[[], None]], module: nn.Module) -> Callable[[int], float]:
        return lambda r: harness.median_ms(make(module), args.repeats)

    times: dict[str, list[float]] = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        for make in (interaction_step, dense_step):
            for module in interactions.values():
                make(module)()  # warm-up (and the kernels' first load from numba's cache)
        systems = {
            f"{part}, {threads} threads, {name}": timed(make, module)
            for part, make in (("interaction", interaction_step), ("dense", dense_step))
            for name, module in interactions.items()
        }
        times |= harness.interleaved_rounds(systems, args.rounds, order="alternate")
    result: dict = {"config": vars(args), "ms": {}, "speedup": {}}
    for threads in args.threads:
        for part in ("interaction", "dense"):
            d = harness.Samples(times[f"{part}, {threads} threads, distrec"]).median
            b = harness.Samples(times[f"{part}, {threads} threads, plain"]).median
            result["ms"][f"{part}_{threads}t"] = {"distrec": round(d, 2), "plain": round(b, 2)}
            result["speedup"][f"{part}_{threads}t"] = round(b / d, 3)
            print(f"{part:>11}, {threads} thread(s): distrec {d:7.2f} ms  plain {b:7.2f} ms  speed-up {b / d:5.2f}")
    measured = [harness.SystemResult(name, "forward + backward (median of the round's calls)", "ms", harness.Samples(t)) for name, t in times.items()]
    return harness.finish(harness.ResultRecord("interaction", measured, None, result))


if __name__ == "__main__":
    main()
