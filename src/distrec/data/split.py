"""Holding out rows for validation and test: drawn at random, the last rows, or the last files.

``random:VAL[:TEST]`` and ``last:VAL[:TEST]`` hold out fractions of the rows: drawn by a
seeded permutation, or the last rows (a time-ordered holdout: train, then val, then test).
``files:[VAL:]TEST`` holds out whole input files: the last TEST files are the test set and
the VAL files before them (none when left out) the validation set. Its last number is
always the test files because holding out the last day is what it is for: MLPerf trains on
the Criteo Terabyte days 0-22 and tests on day 23 (``files:1``); ``files:1:1`` validates on
day 22 as well. Without validation rows a run trains its length (``--epochs``, else one
epoch) and scores the test files at its end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distrec.errors import DistrecError

SPLIT_EXAMPLES = "e.g. random:0.1, random:0.1:0.1, last:0.2, last:0.1:0.1, files:1 or files:1:1"


@dataclass(frozen=True)
class Split:
    """A parsed holdout.

    Attributes:
        kind: random, last or files.
        val: the fraction of rows (random, last) or the number of files (files) held out for validation.
        test: the same for test, or None when there is no test set.
    """

    kind: str
    val: float
    test: float | None


def parse_split(spec: str) -> Split:
    """``random:VAL[:TEST]``, ``last:VAL[:TEST]`` or ``files:[VAL:]TEST``; DistrecError naming the problem."""
    parts = spec.split(":")
    if parts[0] == "files":
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            counts = [int(p) for p in parts[1:]]
        except ValueError:
            raise DistrecError(f"split {spec!r} is not files:[VAL:]TEST with whole numbers of files; {SPLIT_EXAMPLES}") from None
        val, test = (0, counts[0]) if len(counts) == 1 else counts
        if val < 0 or test < 1:
            raise DistrecError(f"split {spec!r}: hold out at least 1 test file and 0 or more validation files; {SPLIT_EXAMPLES}")
        return Split("files", val, test)
    try:
        if parts[0] not in ("random", "last") or len(parts) not in (2, 3):
            raise ValueError
        val, test = float(parts[1]), float(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise DistrecError(f"split {spec!r} is not KIND:VAL[:TEST] with KIND random or last, or files:[VAL:]TEST; {SPLIT_EXAMPLES}") from None
    if not (0 <= val < 1 and 0 <= (test or 0) < 1 and val + (test or 0) < 1):
        raise DistrecError(f"split {spec!r}: fractions must be in [0, 1) and sum below 1; {SPLIT_EXAMPLES}")
    return Split(parts[0], val, test)


def split_rows(spec: str, file_starts: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Row ids (sorted int64) of "train", "val" and, if the spec has a test part, "test".

    Args:
        spec: the holdout (see the module doc).
        file_starts: int64 [files + 1], the first row of each input file and the number of rows.
        seed: the permutation's seed of a random split.

    Raises DistrecError when no training row (or file) is left.
    """
    split = parse_split(spec)
    n = int(file_starts[-1])
    if split.kind == "files":
        files = len(file_starts) - 1
        held = int(split.val + split.test)
        if files - held < 1:
            raise DistrecError(f"split {spec!r} holds out {held} of {files} input file(s), leaving none to train on; give more files or hold out fewer")
        train_end, test_start = int(file_starts[files - held]), int(file_starts[files - int(split.test)])
        return {
            "train": np.arange(train_end, dtype=np.int64),
            "val": np.arange(train_end, test_start, dtype=np.int64),
            "test": np.arange(test_start, n, dtype=np.int64),
        }
    n_val, n_test = round(split.val * n), round((split.test or 0) * n)
    if n - n_val - n_test < 1:
        raise DistrecError(f"split {spec!r} leaves no training rows out of {n}; hold out less")
    order = np.arange(n, dtype=np.int64) if split.kind == "last" else np.random.default_rng(seed).permutation(n)
    parts = {
        "train": order[: n - n_val - n_test],
        "val": order[n - n_val - n_test : n - n_test],
    }
    if split.test is not None:
        parts["test"] = order[n - n_test :]
    return {name: np.sort(rows) for name, rows in parts.items()}
