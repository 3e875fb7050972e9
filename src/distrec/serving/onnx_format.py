"""An exported program as an ONNX model (``distrec export --format onnx``).

torch's ONNX exporter (``torch.onnx.export(..., dynamo=True)``, which needs the ``onnx`` and
``onnxscript`` packages: ``pip install 'distrec[onnx]'``) translates the program operator by
operator; one it cannot translate is named in a one-line error. When ``onnxruntime`` is
installed the ONNX model is run on a batch and must give the program's scores.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.export import ExportedProgram

from distrec.errors import DistrecError
from distrec.serving.inputs import INPUT_NAMES, JaggedInputs

OUTPUT_NAME = "probability"
INSTALL = "pip install 'distrec[onnx]'"
TOLERANCE = 1e-5
"""The largest difference (probability) between onnxruntime's scores and the program's."""
_OPERATOR = re.compile(r"(?:No ONNX function found for <OpOverload\(op='|target=torch\.ops\.)([\w.]+)")


def missing_operator(error: BaseException) -> str:
    """The operator an ONNX export failed on (``aten.searchsorted.Tensor``), else the error's first line."""
    found = _OPERATOR.search(str(error))
    if found:
        return f"it has no translation of the operator {found.group(1)}"
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


@contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's progress lines and its warnings (optional packages, deprecations inside torch) kept off the terminal."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def save_onnx(program: ExportedProgram, path: Path, check: JaggedInputs) -> bool:
    """Write ``program`` as an ONNX model to ``path``; returns whether onnxruntime checked it
    (its scores on the batch ``check`` within ``TOLERANCE`` of the program's).

    Raises:
        DistrecError: onnx or onnxscript is not installed, the exporter lacks an operator of
            the model, or onnxruntime's scores differ.
    """
    for package in ("onnx", "onnxscript"):
        if importlib.util.find_spec(package) is None:
            raise DistrecError(f"--format onnx needs the {package} package, which is not installed; {INSTALL}, or export --format pt2")
    with _quiet():
        try:
            exported = torch.onnx.export(program, (), dynamo=True, input_names=list(INPUT_NAMES), output_names=[OUTPUT_NAME], verbose=False)
        except Exception as e:  # the exporter's ConversionError, wrapping what it could not translate
            raise DistrecError(f"the ONNX exporter cannot translate this model: {missing_operator(e)}; export it with --format pt2 instead") from None
        assert exported is not None  # dynamo=True always returns the ONNX program
        exported.save(str(path))
    if importlib.util.find_spec("onnxruntime") is None:
        return False
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: t.numpy() for name, t in zip(INPUT_NAMES, check)})[0]
    expected = program.module()(*check).numpy()
    difference = float(np.abs(got - expected).max(initial=0.0))
    if not difference <= TOLERANCE:
        raise DistrecError(f"onnxruntime scores the ONNX model up to {difference:.2g} away from the program; export it with --format pt2 instead")
    return True
