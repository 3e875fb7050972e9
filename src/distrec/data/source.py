"""What every data source yields: chunks of parsed rows, their feature layout, skipped rows.

Raw categorical values are non-negative int64 *raw ids*: 0 means missing, >= 1 a present
value (a hash or an id). Sources never know table sizes; ``distrec.data.dataset`` maps raw
ids to table rows at batch time, so a prepared cache serves any ``max_ind_range``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distrec.errors import DistrecError

# How many malformed rows are reported by line number ("the first few").
REPORTED_MALFORMED_ROWS = 5


@dataclass(frozen=True)
class SparseFeature:
    """One categorical feature of a data set.

    Attributes:
        name: feature name (also the name of its embedding table).
        multi_hot: whether a row may carry a bag of several values (else exactly one).
        id_bound: exclusive upper bound on the raw ids when they are small integer ids
            (a table of ``id_bound`` rows then maps them one to one), or None for hashes.
    """

    name: str
    multi_hot: bool = False
    id_bound: int | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "multi_hot": self.multi_hot, "id_bound": self.id_bound}

    @classmethod
    def from_dict(cls, d: dict) -> SparseFeature:
        return cls(str(d["name"]), bool(d["multi_hot"]), None if d["id_bound"] is None else int(d["id_bound"]))


@dataclass
class Chunk:
    """A block of parsed rows.

    Attributes:
        dense: float32 [n, n_dense] dense features.
        labels: float32 [n] labels in {0, 1}.
        sparse: per feature (in the source's feature order) a pair (values int64 [nnz] raw
            ids, lengths int32 [n] bag sizes); a single-hot feature has every length 1.
    """

    dense: np.ndarray
    labels: np.ndarray
    sparse: list[tuple[np.ndarray, np.ndarray]]

    @property
    def num_rows(self) -> int:
        return int(self.labels.shape[0])

    @staticmethod
    def concat(chunks: list[Chunk], num_dense: int, num_features: int) -> Chunk:
        """All rows of ``chunks`` in order (an empty chunk of that shape if there are none)."""
        if not chunks:
            empty = (np.zeros(0, np.int64), np.zeros(0, np.int32))
            return Chunk(np.zeros((0, num_dense), np.float32), np.zeros(0, np.float32), [empty] * num_features)
        sparse = [(np.concatenate([c.sparse[f][0] for c in chunks]), np.concatenate([c.sparse[f][1] for c in chunks])) for f in range(num_features)]
        return Chunk(np.concatenate([c.dense for c in chunks]), np.concatenate([c.labels for c in chunks]), sparse)


def single_hot(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (values, lengths) pair of a single-hot feature with raw ids ``raw`` (int64 [n])."""
    return raw, np.ones(raw.shape[0], np.int32)


def gather_bags(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bags of ``rows`` from a jagged column (values [nnz], offsets int64 [N + 1]).

    Returns the concatenated values of the selected bags, in the order of ``rows``, and
    their lengths (int64 [len(rows)]), copied bag by bag by ``distrec.kernels.jagged``.
    """
    from distrec.kernels import compiled  # torch and numba load on first use, not in a process that only parses

    return compiled("jagged").gather_bags(values, np.asarray(offsets, np.int64), np.asarray(rows, np.int64))


class MalformedRows:
    """Rows of one input skipped as malformed: their count, the line numbers of all of them
    (:meth:`lines`) and the first few with reasons.

    With ``strict``, :meth:`raise_if_strict` turns the first malformed row into a
    DistrecError naming the file and line.
    """

    def __init__(self, path: str | Path, strict: bool = False, unit: str = "line") -> None:
        self.path = str(path)
        self.strict = strict
        self.unit = unit
        self.count = 0
        self.first: list[tuple[int, str]] = []  # (line, reason), sorted, the smallest lines
        self._lines: list[np.ndarray] = []  # every recorded line, in blocks as recorded

    def add(self, lines: np.ndarray | list[int], reason: str) -> None:
        """Record malformed rows at ``lines`` (1-based line or row numbers)."""
        lines = np.asarray(lines, np.int64)
        if lines.size == 0:
            return
        self.count += int(lines.size)
        self._lines.append(lines)
        smallest = np.sort(lines)[:REPORTED_MALFORMED_ROWS]
        self.first = sorted(self.first + [(int(n), reason) for n in smallest])[:REPORTED_MALFORMED_ROWS]

    def merge(self, other: MalformedRows, line_offset: int = 0) -> None:
        """Add the rows ``other`` counted, its line numbers moved down by ``line_offset`` (the
        lines before the part of the input it read)."""
        self.count += other.count
        self.first = sorted(self.first + [(n + line_offset, reason) for n, reason in other.first])[:REPORTED_MALFORMED_ROWS]
        self._lines += [lines + line_offset for lines in other._lines]

    def lines(self) -> np.ndarray:
        """The line (or row) numbers of every recorded row, ascending: int64 [count] (empty
        for rows read from a manifest, which keeps only the first few)."""
        return np.sort(np.concatenate(self._lines)) if self._lines else np.zeros(0, np.int64)

    def raise_if_strict(self) -> None:
        if self.strict and self.count:
            line, reason = self.first[0]
            raise DistrecError(f"{self.path}: {self.unit} {line}: {reason}; fix the row or drop --strict to skip malformed rows")

    def summary(self) -> str:
        """One line: how many rows were skipped and where the first ones are."""
        where = ", ".join(f"{self.unit} {n} ({reason})" for n, reason in self.first)
        return f"{self.path}: skipped {self.count} malformed row(s); first at {where}"

    def to_manifest(self) -> dict:
        """The manifest entries: ``malformed_rows`` (count), ``malformed_lines`` (the first few), ..."""
        return {
            "malformed_rows": self.count,
            "malformed_lines": [n for n, _ in self.first],
            "malformed_reasons": [r for _, r in self.first],
            "malformed_file": self.path,
            "malformed_unit": self.unit,
        }

    @classmethod
    def from_manifest(cls, manifest: dict, strict: bool = False) -> MalformedRows:
        rows = cls(manifest["malformed_file"], strict, manifest["malformed_unit"])
        rows.count = int(manifest["malformed_rows"])
        rows.first = list(zip(manifest["malformed_lines"], manifest["malformed_reasons"]))
        return rows


class RowCheck:
    """The malformed rows of one batch, each flagged with the first reason found."""

    def __init__(self, num_rows: int) -> None:
        self.bad = np.zeros(num_rows, bool)
        self._reasons: list[tuple[np.ndarray, str]] = []

    def flag(self, mask: np.ndarray, reason: str) -> None:
        if not mask.any():
            return
        new = mask & ~self.bad
        if new.any():
            self._reasons.append((np.flatnonzero(new), reason))
            self.bad |= new

    def report(self, malformed: MalformedRows, line_numbers: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Record the flagged rows in ``malformed`` and return the indices of the good rows.

        ``line_numbers`` maps row indices of this batch to 1-based line numbers.
        """
        for rows, reason in self._reasons:
            malformed.add(line_numbers(rows), reason)
        malformed.raise_if_strict()
        return np.flatnonzero(~self.bad)


@dataclass
class Source:
    """A parsed input: its layout and a one-shot stream of chunks.

    ``malformed`` is complete once ``chunks`` is exhausted. ``num_rows`` is the row count
    when known in advance (for a progress bar's total), else None; ``fraction_read``, when
    given, tells how much of the input the chunks so far have consumed (0 to 1), and
    ``lines_read`` how many lines (of a text input; rows of a Parquet file) they took, so
    that a part of a file can number its lines after the parts before it. ``header_lines``
    is how many of the input's first lines are no row (1 for a header line).
    """

    description: dict
    label: str
    dense: list[str]
    features: list[SparseFeature]
    chunks: Iterator[Chunk]
    malformed: MalformedRows
    num_rows: int | None = None
    fraction_read: Callable[[], float] | None = None
    lines_read: Callable[[], int] | None = None
    header_lines: int = 0


def existing_path(path: str | Path, what: str = "data", kind: str = "file") -> Path:
    """``path`` made absolute, or a DistrecError if there is no such file (or directory)."""
    p = Path(path).expanduser().resolve()
    ok = p.is_dir() if kind == "directory" else p.is_file()
    if not ok:
        flag = "--schema" if what == "schema" else "--data"
        raise DistrecError(f"{what} {kind} {str(path)!r} not found; check {flag}")
    return p


def describe_error(e: Exception, limit: int = 160) -> str:
    """The first line of an Arrow or OS error, non-printable characters escaped, at most ``limit`` characters."""
    lines = str(e).splitlines() or [type(e).__name__]
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in lines[0])
    return text if len(text) <= limit else text[: limit - 3] + "..."
