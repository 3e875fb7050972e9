"""Embedding rows stored in half precision, updated in float32 and rounded stochastically.

A table stored as fp16 or bf16 takes half the bytes of float32. Everything computed from its
rows is float32: the pooled sums, the gradients (a half table's parameter has float32
gradients, ``grad_dtype``), the optimizer's state and the update. Only the write of an updated
row rounds it to the table's dtype, stochastically (up with the probability of the
remainder's share of the gap, as FBGEMM rounds its FP16 weights): the expected stored value
is the float32 one, so updates far smaller than a half's spacing still move a row on
average, where round-to-nearest would drop them every time.

The random numbers come from a generator seeded by a key and a counter (``rounding_generator``),
kept by whoever writes the rows (the sparse optimizers keep the counter in their parameter
groups), so a resumed run rounds exactly as the original did.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from distrec.config import TableDtype
from distrec.errors import DistrecError

ROUNDING_KEY = "rounding_key"
"""The attribute of a half table naming the random stream of its rounded writes for the sparse
optimizers (an int below 2**32), in place of the table's place in its parameter group: for a
table that several processes must round alike although its place differs between them (a
replicated table), or a view of stored rows stepped on its own."""

TORCH_DTYPES: dict[TableDtype, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def torch_dtype(name: TableDtype) -> torch.dtype:
    """The torch dtype of a ``TableDtype`` name."""
    if name not in TORCH_DTYPES:
        raise DistrecError(f"model.table_dtype is {name!r}; choose one of: {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def is_half(table: torch.Tensor) -> bool:
    """Whether ``table``'s rows are stored in a half-precision dtype (fp16 or bf16)."""
    return table.dtype in (torch.float16, torch.bfloat16)


def compute_dtype(table: torch.Tensor) -> torch.dtype:
    """The dtype rows of ``table`` are computed in, and its optimizer state kept in: float32
    for a half table, else the table's own."""
    return torch.float32 if is_half(table) else table.dtype


def with_float32_gradients(table: torch.Tensor) -> torch.Tensor:
    """``table`` itself, set to take float32 gradients if it is half (``grad_dtype``): a half
    table's gradient would otherwise be rounded to half, and small ones flushed to 0."""
    if is_half(table):
        table.grad_dtype = torch.float32
    return table


def table_parameter(rows: torch.Tensor) -> nn.Parameter:
    """``rows`` [num_rows, D] as a parameter whose gradients are float32 whatever its dtype
    (``with_float32_gradients``)."""
    return with_float32_gradients(nn.Parameter(rows))


def rounding_generator(key: Sequence[int], counter: int, device: torch.device) -> torch.Generator:
    """A generator on ``device`` seeded by (``key``, ``counter``): the random stream of one write
    (e.g. key: a parameter's place in its optimizer and a block of rows, counter: the step)."""
    seed = np.random.SeedSequence([*key, counter]).generate_state(1, np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(seed))


DROPPED_BITS = {torch.float16: 13, torch.bfloat16: 16}
"""The low bits of a float32's mantissa that each half dtype has no room for (23 - 10, 23 - 7)."""


def round_stochastically(values: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """``values`` (float32, any shape) in ``dtype``, each rounded to one of its two neighbours in
    ``dtype`` with probabilities that make the expected result ``values`` (unbiased rounding).

    In the bits: a uniform random integer below 2^k is added to the float32's bits, whose low
    k bits (those ``dtype`` drops) are then cleared. The magnitude moves up to the next number
    of ``dtype`` exactly when the noise carries into the kept bits, with the probability of the
    dropped bits' share of the gap, and the sign stays. fp16 values below 2^-14 in magnitude
    (its subnormals) are rounded to the nearest after that: their spacing, 2^-24, is coarser
    than 13 dropped bits.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> round_stochastically(torch.full((100_000,), 1 + 2**-12), torch.float16, g).float().mean()
        tensor(1.0002)                       # round-to-nearest gives 1.0 every time
    """
    dropped = DROPPED_BITS[dtype]
    noise = torch.randint(0, 1 << dropped, values.shape, generator=generator, device=values.device, dtype=torch.int32)
    bits = values.contiguous().view(torch.int32).add(noise).bitwise_and_(-(1 << dropped))
    return bits.view(torch.float32).to(dtype)


@torch.no_grad()
def add_to_rows(table: torch.Tensor, rows: torch.Tensor, delta: torch.Tensor, generator: torch.Generator) -> None:
    """``table[rows] += delta`` for distinct ``rows`` int64 [n] of a half table [num_rows, D],
    computed in float32 from float32 ``delta`` [n, D] and rounded stochastically on write."""
    updated = table.index_select(0, rows).float().add_(delta)
    table.index_copy_(0, rows, round_stochastically(updated, table.dtype, generator))
