"""The forms an export takes: how its tables are stored and which program file it is.

Kept free of heavy imports: the command line lists these choices without loading torch.
"""

from __future__ import annotations

from typing import Literal, get_args

ServingDtype = Literal["fp32", "fp16", "bf16", "int8"]
"""Served embedding rows as float32, float16, bfloat16, or 8-bit row-wise with a float32 scale
and bias per row."""
SERVING_DTYPES: tuple[str, ...] = get_args(ServingDtype)

ProgramFormat = Literal["pt2", "onnx"]
"""A ``torch.export`` program (``torch.export.save``) or an ONNX model."""
PROGRAM_FORMATS: tuple[str, ...] = get_args(ProgramFormat)
