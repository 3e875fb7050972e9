"""Optimizers: sparse row updates for embeddings (never densified) and dense ones for the rest.

Embedding gradients are sparse COO tensors whose entries are (row, gradient of that row),
possibly with a row repeated (one entry per lookup, uncoalesced). The optimizers here update
only the rows that occur; their state is a plain tensor per parameter, so ``state_dict`` /
``load_state_dict`` resume a run exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.optim import Optimizer

from distrec.errors import DistrecError
from distrec.kernels import compiled, runs_compiled
from distrec.kernels.rows import add_to_distinct_rows
from distrec.models.base import RecommendationModel
from distrec.models.embedding import group_by_row, sum_by_row, update_rows_in_backward
from distrec.table_dtype import ROUNDING_KEY, add_to_rows, compute_dtype, is_half, rounding_generator

OPTIMIZER_NAMES = ("sgd", "adagrad", "adam")

# The optimizers update this many rows at a time, so that the elementwise passes over a block
# stay in the L2 cache (1024 rows x 64 floats x 4 B = 256 KB per temporary) and temporaries
# stay small (benchmarks/results/2026-11-27-cpu-kernels.md).
ROWS_PER_BLOCK = 1024
# Coalesced gradients (distinct rows) are scattered this many rows at a time, each block split
# over the threads (``add_to_distinct_rows``): large enough that every thread gets one long
# scatter, small enough that a block's temporary stays small (65,536 x 64 floats = 16 MB).
DISTINCT_ROWS_PER_BLOCK = 65_536


ROUNDING_STEPS = "rounding_steps"
"""The parameter-group entry counting the steps that wrote half-precision rows: the counter of
their rounding's random streams, saved with the group's hyperparameters."""


def count_rounding_step(group: dict) -> None:
    """Count one more step that wrote half-precision rows in ``group``."""
    group[ROUNDING_STEPS] = group.get(ROUNDING_STEPS, 0) + 1


def gradient_rows(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of a sparse row gradient: rows int64 [nnz] and values [nnz, D], repeats kept."""
    if not grad.is_sparse:
        raise TypeError("sparse optimizers need sparse gradients (embedding_bag(..., sparse=True))")
    return grad._indices()[0], grad._values()


def has_distinct_rows(grad: torch.Tensor) -> bool:
    """Whether a sparse row gradient is known to hold each row once, in increasing order.

    Autograd drops the coalesced flag when it stores a sparse gradient in ``.grad``, so on
    the host the rows themselves are checked (one comparison per entry, far cheaper than a
    sort). Elsewhere (a GPU) reading the answer back would stall the step: only the flag
    counts, and callers that are not sure take the general path (the same result).
    """
    if grad.is_coalesced():
        return True
    rows = gradient_rows(grad)[0]
    return runs_compiled(rows) and bool(torch.all(rows[1:] > rows[:-1]))


def coalesced_rows(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of a sparse row gradient, sorted, and the summed gradient of each: [U], [U, D]."""
    rows, values = gradient_rows(grad)
    return (rows, values) if has_distinct_rows(grad) else sum_by_row(rows, values, grad.shape[0])


def row_grouping(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct rows of a sparse row gradient [U], sorted, with the bounds [U + 1] of each
    row's range of entries and the entries [nnz] in row order (``group_by_row``)."""
    rows = gradient_rows(grad)[0]
    if has_distinct_rows(grad):  # entry u is row u's
        return rows, torch.arange(rows.numel() + 1, device=rows.device), torch.arange(rows.numel(), device=rows.device)
    return group_by_row(rows, grad.shape[0])


def fused_update(param: torch.Tensor) -> bool:
    """Whether ``param``'s rows are updated by the one-pass kernels (``distrec.kernels.row_updates``):
    float32 weights the compiled kernels take (``runs_compiled``); other devices and types take the torch operators."""
    return param.dtype == torch.float32 and runs_compiled(param)


def row_blocks(rows: torch.Tensor, values: torch.Tensor, size: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive slices of ``size`` (default ``ROWS_PER_BLOCK``) entries of (rows [n], values [n, D]) (views)."""
    size = size or ROWS_PER_BLOCK
    for start in range(0, rows.numel(), size):
        yield rows[start : start + size], values[start : start + size]


def evaluate_closure(closure) -> torch.Tensor | None:
    """The loss of an optimizer's ``step(closure)`` argument, computed with gradients on (None without one)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def with_row_weight_decay(param: torch.Tensor, grad: torch.Tensor, weight_decay: float) -> torch.Tensor:
    """``grad`` coalesced, plus ``weight_decay * w[r]`` for each distinct touched row r.

    This is the gradient of an L2 penalty ``weight_decay / 2 * ||w[r]||^2`` on the rows a
    batch looks up (once per row per step), the "lazy" weight decay of sparse embeddings:
    rows that are not looked up are neither updated nor decayed.
    """
    rows, values = coalesced_rows(grad)
    values = torch.addcmul(values, param.index_select(0, rows).to(values.dtype), values.new_tensor(weight_decay))
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values, grad.shape, is_coalesced=True, check_invariants=False)


class SparseRowOptimizer(Optimizer):
    """Base of the sparse optimizers: visits each parameter that has a gradient.

    Every sparse optimizer takes ``weight_decay`` (default 0): an L2 penalty on the touched
    rows, added to their gradient (see ``with_row_weight_decay``).

    Those with a one-pass kernel (``update_rows``) can also step in backward
    (``update_in_backward``): float32 CPU weights without weight decay then get no gradient,
    and ``step`` has nothing left to do for them.

    Rows of a half-precision table (fp16, bf16: ``distrec.table_dtype``) are updated in
    float32 and rounded stochastically when written (``add_to_rows``); the random stream of
    a write is keyed by the parameter's place in its group (or its ``ROUNDING_KEY``), the
    group's ``rounding_steps`` (the steps that wrote half rows, saved with the
    hyperparameters so a resume rounds as the run did) and the block of rows. The state
    stays float32.
    """

    fuses_rows: bool = False
    """Whether ``update_rows`` exists (a one-pass kernel of ``distrec.kernels.row_updates``)."""

    def update_rows(
        self, param: torch.Tensor, rows: torch.Tensor, bounds: torch.Tensor, picks: torch.Tensor, grad: torch.Tensor, group: dict, state: dict
    ) -> None:
        """One step on distinct ``rows`` of ``param`` whose gradients are grouped sums of ``grad`` rows (``RowUpdate``)."""
        raise NotImplementedError

    def update_in_backward(self, enable: bool = True, only: Iterable[torch.Tensor] | None = None) -> None:
        """Step every float32 CPU parameter without weight decay during backward (``pool_sum``'s),
        from its grouped output gradient, instead of from a gradient in ``step``; ``enable=False`` undoes it.
        ``only``: just these of the optimizer's parameters (default: all).

        The result equals backward then ``step``; only call it when nothing reads or
        accumulates the embedding gradients in between (see ``update_rows_in_backward``).
        """
        chosen = None if only is None else {id(p) for p in only}
        for group in self.param_groups:
            for p in group["params"]:
                if chosen is not None and id(p) not in chosen:
                    continue
                fused = enable and self.fuses_rows and not group["weight_decay"] and fused_update(p)
                update_rows_in_backward(p, functools.partial(self._update_in_backward, p) if fused else None)

    @torch.no_grad()
    def _update_in_backward(self, param: torch.Tensor, rows: torch.Tensor, bounds: torch.Tensor, picks: torch.Tensor, grad: torch.Tensor) -> None:
        group = next(g for g in self.param_groups if any(q is param for q in g["params"]))  # looked up now: load_state_dict replaces groups
        self.update_rows(param, rows, bounds, picks, grad, group, self.state[param])

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            rounded = False
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = with_row_weight_decay(p, p.grad, group["weight_decay"]) if group["weight_decay"] else p.grad
                self.update(p, grad, group, self.state[p])
                rounded |= is_half(p)
            if rounded:
                count_rounding_step(group)
        return loss

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("weight_decay", 0.0)  # state saved before weight decay existed

    def add_to_rows(self, param: torch.Tensor, rows: torch.Tensor, delta: torch.Tensor, group: dict, block: int) -> None:
        """``param[rows] += delta`` (float32 [n, D]) for distinct ``rows`` [n], the ``block``-th
        such write of this step: added in place in a float32 table, rounded stochastically
        into a half one."""
        if not is_half(param):
            add_to_distinct_rows(param, rows, delta)
            return
        key = getattr(param, ROUNDING_KEY, None)
        if key is None:
            key = next(i for i, q in enumerate(group["params"]) if q is param)
        add_to_rows(param, rows, delta, rounding_generator([key, block], group.get(ROUNDING_STEPS, 0), param.device))

    def update(self, param: torch.Tensor, grad: torch.Tensor, group: dict, state: dict) -> None:
        """Apply one step to the rows of ``param`` that ``grad`` touches: the one-pass kernel
        for float32 CPU weights when there is one, else the torch operators."""
        if self.fuses_rows and fused_update(param):
            self.update_rows(param, *row_grouping(grad), gradient_rows(grad)[1].contiguous(), group, state)
        else:
            self.update_with_operators(param, grad, group, state)

    def update_with_operators(self, param: torch.Tensor, grad: torch.Tensor, group: dict, state: dict) -> None:
        """``update`` in torch operators (any device and dtype)."""
        raise NotImplementedError


class SparseSGD(SparseRowOptimizer):
    """Plain SGD on the touched rows: ``w[r] -= lr * g`` for every entry (repeats add up).

    Equal to ``torch.optim.SGD`` (no momentum, no weight decay) on the dense gradient.

    Example:
        >>> opt = SparseSGD(model.sparse_parameters(), lr=0.1)
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 0.01, weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))

    fuses_rows = True

    def update_rows(self, param, rows, bounds, picks, grad, group, state):
        compiled("row_updates").sgd_rows(param, rows, bounds, picks, grad, group["lr"])

    def update_with_operators(self, param, grad, group, state):
        entries = gradient_rows(grad)
        distinct = has_distinct_rows(grad)
        # index_add_ without alpha takes the vectorised path; with alpha it does not on CPU
        if distinct or is_half(param):  # each row once: scattered by all threads, or rounded
            rows_once = entries if distinct else sum_by_row(*entries, grad.shape[0])
            for block, (rows, values) in enumerate(row_blocks(*rows_once, DISTINCT_ROWS_PER_BLOCK)):
                self.add_to_rows(param, rows, values * -group["lr"], group, block)
        else:  # rows may repeat, so one thread adds them in order
            for rows, values in row_blocks(*entries):
                param.index_add_(0, rows, values * -group["lr"])


class RowWiseAdagrad(SparseRowOptimizer):
    """Adagrad with one accumulator per row, as FBGEMM's (exact) row-wise Adagrad.

    For each touched row r with summed gradient g (D floats):
    ``s[r] += mean(g ** 2)``, ``w[r] -= lr * g / (sqrt(s[r]) + eps)``.
    State: ``sum`` float [num_rows] (4 bytes per row instead of 4 * D).

    Example:
        >>> opt = RowWiseAdagrad(model.sparse_parameters(), lr=0.01)
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: float = 0.01,
        eps: float = 1e-10,
        initial_accumulator_value: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = dict(lr=lr, eps=eps, initial_accumulator_value=initial_accumulator_value, weight_decay=weight_decay)
        super().__init__(params, defaults)

    fuses_rows = True

    @staticmethod
    def accumulator(param: torch.Tensor, group: dict, state: dict) -> torch.Tensor:
        """The row accumulator of ``param`` (made at its first step)."""
        if not state:
            state["sum"] = torch.full((param.shape[0],), group["initial_accumulator_value"], dtype=compute_dtype(param), device=param.device)
        return state["sum"]

    def update_rows(self, param, rows, bounds, picks, grad, group, state):
        compiled("row_updates").rowwise_adagrad_rows(param, self.accumulator(param, group, state), rows, bounds, picks, grad, group["lr"], group["eps"])

    def update_with_operators(self, param, grad, group, state):
        accumulator = self.accumulator(param, group, state)
        for block, (rows, g) in enumerate(row_blocks(*coalesced_rows(grad), DISTINCT_ROWS_PER_BLOCK)):
            add_to_distinct_rows(accumulator, rows, torch.linalg.vector_norm(g, dim=1).square_().div_(g.shape[1]))
            scale = accumulator.index_select(0, rows).sqrt_().add_(group["eps"]).reciprocal_().mul_(-group["lr"])
            self.add_to_rows(param, rows, g * scale.unsqueeze(1), group, block)


class LazyAdam(SparseRowOptimizer):
    """Adam that updates only the touched rows and their moments (lazy, like torch's SparseAdam).

    Uses the hyperparameters and formula of ``torch.optim.Adam`` (eps added to the
    bias-corrected sqrt of the second moment), with the step count of the parameter, so a
    parameter whose rows are all touched at every step follows torch's Adam exactly.
    State: ``step`` (int), ``exp_avg`` and ``exp_avg_sq`` (each the size of the table).

    Example:
        >>> opt = LazyAdam(model.sparse_parameters(), lr=1e-3)
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def update_with_operators(self, param, grad, group, state):
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(param, dtype=compute_dtype(param))
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=compute_dtype(param))
        beta1, beta2 = group["betas"]
        state["step"] += 1
        step = state["step"]
        # torch's Adam step lr / c1 * m / (sqrt(v) / sqrt(c2) + eps), with sqrt(c2) moved out
        sqrt_c2 = math.sqrt(1 - beta2**step)
        eps = group["eps"] * sqrt_c2
        scale = -group["lr"] * sqrt_c2 / (1 - beta1**step)
        for block, (rows, g) in enumerate(row_blocks(*coalesced_rows(grad))):
            # the moments move by deltas: index_add_ is the fastest row scatter on CPU
            old = state["exp_avg"].index_select(0, rows)
            exp_avg = torch.lerp(old, g, 1 - beta1)
            state["exp_avg"].index_add_(0, rows, old.neg_().add_(exp_avg))
            old = state["exp_avg_sq"].index_select(0, rows)
            exp_avg_sq = torch.lerp(old, g * g, 1 - beta2)
            state["exp_avg_sq"].index_add_(0, rows, old.neg_().add_(exp_avg_sq))
            self.add_to_rows(param, rows, exp_avg.div_(exp_avg_sq.sqrt_().add_(eps)).mul_(scale), group, block)


def optimizer_of(optimizers: list[Optimizer], params: list[nn.Parameter]) -> Optimizer | None:
    """The optimizer of ``optimizers`` that updates ``params`` (None when ``params`` is empty)."""
    if not params:
        return None
    return next(o for o in optimizers if any(p is params[0] for g in o.param_groups for p in g["params"]))


SPARSE_OPTIMIZERS: dict[str, type[SparseRowOptimizer]] = {"sgd": SparseSGD, "adagrad": RowWiseAdagrad, "adam": LazyAdam}
DENSE_OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}


def make_optimizers(
    model: RecommendationModel,
    name: str,
    lr: float,
    embedding_name: str | None = None,
    embedding_lr: float | None = None,
    weight_decay: float = 0.0,
    embedding_weight_decay: float = 0.0,
) -> list[Optimizer]:
    """A dense optimizer for ``model.dense_parameters()``, one of the same kind for
    ``model.tower_parameters()`` (DMT's tower modules, saved per tower) and a sparse one for
    ``model.sparse_parameters()``.

    Args:
        model: the model whose parameter groups get the optimizers.
        name: ``sgd``, ``adagrad`` or ``adam`` for the dense parameters.
        lr: learning rate of the dense parameters.
        embedding_name: optimizer of the embeddings (default: ``name``; Adagrad is row-wise).
        embedding_lr: learning rate of the embeddings (default: ``lr``).
        weight_decay: L2 penalty of the dense parameters (torch's ``weight_decay``).
        embedding_weight_decay: L2 penalty of the embedding rows a step touches.

    Returns:
        The optimizers that have parameters, in that order. Dense ones use torch's fused
        kernels on CPU and CUDA.

    Example:
        >>> dense_opt, sparse_opt = make_optimizers(model, "adagrad", 0.01)
    """
    embedding_name = embedding_name or name
    for key, value in (("train.optimizer", name), ("train.embedding_optimizer", embedding_name)):
        if value not in OPTIMIZER_NAMES:
            raise DistrecError(f"{key} is {value!r}; choose one of: {', '.join(OPTIMIZER_NAMES)}")
    optimizers: list[Optimizer] = []
    for dense in (model.dense_parameters(), model.tower_parameters()):
        if dense:
            fused = all(p.device.type in ("cpu", "cuda") for p in dense)
            optimizers.append(DENSE_OPTIMIZERS[name](dense, lr=lr, weight_decay=weight_decay, fused=fused or None))
    sparse = model.sparse_parameters()
    if sparse:
        sparse_lr = embedding_lr if embedding_lr is not None else lr
        optimizers.append(SPARSE_OPTIMIZERS[embedding_name](sparse, lr=sparse_lr, weight_decay=embedding_weight_decay))
    return optimizers
