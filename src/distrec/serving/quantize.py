"""How a served model stores its embedding rows: float32, float16, bfloat16 or 8-bit row-wise.

The 8-bit form is FBGEMM's fused row-wise quantisation: row ``w`` (D floats) becomes D bytes
``q = round((w - bias) / scale)`` with ``scale = (max(w) - min(w)) / 255`` and ``bias =
min(w)``, and its float32 ``scale`` and ``bias`` (8 bytes): D + 8 bytes per row instead of
4 D. A row reads back as ``q * scale + bias``, within ``scale / 2`` of every original value.
Here the bytes and the (scale, bias) pairs are two arrays (uint8 [R, D] and float32 [R, 2]),
so that the lookup dequantises with plain tensor operators (``torch.export`` and ONNX have
no operator reading floats out of bytes).

Tables are converted a block of rows at a time: a table memory-mapped from disk (Hotline's
tiers) is read once, and only the smaller result is held whole.
"""

from __future__ import annotations

import torch

from distrec.serving.formats import ServingDtype

BLOCK_ROWS = 1 << 16
"""Rows converted at a time (4 MiB of a 16-float table)."""
FLOAT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
"""The torch dtype of each float form."""
LEVELS = 255
"""Steps between a row's minimum and maximum in the 8-bit form."""


def quantize_rows(weight: torch.Tensor, dtype: ServingDtype) -> dict[str, torch.Tensor]:
    """The stored form of the float rows ``weight`` [R, D] (any strides, e.g. a memory map):
    ``{"rows": float32, float16 or bfloat16 [R, D]}``, or for ``int8`` ``{"rows": uint8 [R, D],
    "scale_bias": float32 [R, 2]}``, each made a block of rows at a time.

    Example:
        >>> stored = quantize_rows(torch.tensor([[0.0, 1.0, 0.5]]), "int8")
        >>> stored["rows"], stored["scale_bias"]
        (tensor([[  0, 255, 128]], dtype=torch.uint8), tensor([[0.0039, 0.0000]]))
    """
    num_rows, dim = weight.shape
    if dtype == "fp32" and weight.dtype == torch.float32 and weight.is_contiguous():
        return {"rows": weight.detach().cpu()}  # as it is: no copy of a table already in this form
    if dtype == "int8":
        stored = {"rows": torch.empty(num_rows, dim, dtype=torch.uint8), "scale_bias": torch.empty(num_rows, 2, dtype=torch.float32)}
    else:
        stored = {"rows": torch.empty(num_rows, dim, dtype=FLOAT_DTYPES[dtype])}
    for start in range(0, num_rows, BLOCK_ROWS):
        block = weight[start : start + BLOCK_ROWS].detach().to("cpu", torch.float32)
        if dtype == "int8":
            low, high = block.amin(1, keepdim=True), block.amax(1, keepdim=True)
            scale = (high - low) / LEVELS
            steps = torch.where(scale > 0, (block - low) / torch.where(scale > 0, scale, 1.0), 0.0)
            stored["rows"][start : start + block.shape[0]] = steps.round_().clamp_(0, LEVELS).to(torch.uint8)
            stored["scale_bias"][start : start + block.shape[0]] = torch.cat([scale, low], dim=1)
        else:
            stored["rows"][start : start + block.shape[0]] = block
    return stored


def dequantize(stored: torch.Tensor, scale_bias: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    """The float32 values [n, D] of rows ``rows`` (int64 [n]) of a table stored as
    ``quantize_rows`` made it (``stored``: its ``rows``, ``scale_bias``: its ``scale_bias``
    or None), in plain torch operators."""
    values = stored[rows].to(torch.float32)
    if scale_bias is not None:
        picked = scale_bias[rows]
        values = values * picked[:, 0:1] + picked[:, 1:2]
    return values


def stored_bytes(stored: dict[str, torch.Tensor]) -> int:
    """Bytes of the stored tables."""
    return sum(t.numel() * t.element_size() for t in stored.values())
