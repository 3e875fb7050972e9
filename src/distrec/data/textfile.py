"""Streaming a delimited text file (plain or .gz) in bounded memory, keeping line numbers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from distrec.data.source import MalformedRows, describe_error
from distrec.errors import DistrecError

# Bytes of text read per parse block for each row wanted in a chunk (rows are split
# further when a block holds more than a chunk); the floor keeps any one line inside a block.
_BYTES_PER_ROW = 256
_MIN_BLOCK_BYTES = 1 << 20
_MAX_BLOCK_BYTES = 1 << 24  # larger blocks parse slower (their columns no longer fit the caches)
# Bytes at the start of a file checked for NUL bytes (binary content).
_SNIFF_BYTES = 1 << 16
# Compressed inputs by extension (the ones Arrow's compression="detect" knows).
_CODECS = {".bz2": "bz2", ".gz": "gzip", ".lz4": "lz4", ".zst": "zstd"}


def read_header(path: Path, delimiter: str, encoding: str = "utf8") -> list[str]:
    """The column names on the first line of a delimited file (fields may be quoted)."""
    reader = _open(path, delimiter, True, None, {}, None, encoding, _MIN_BLOCK_BYTES, lambda row: "skip")
    if reader is None:
        raise DistrecError(f"{path} is empty; check --data")
    with reader:
        return list(reader.schema.names)


def _check_text(path: Path) -> None:
    """DistrecError if ``path`` (decompressed when it is .gz) starts like a binary file.

    Text formats never hold a NUL byte in their first block; binary files (images,
    executables, Parquet, a cache file) almost always do.
    """
    try:
        with pa.input_stream(str(path), compression="detect") as f:
            head = f.read(_SNIFF_BYTES)
    except (pa.ArrowInvalid, OSError) as e:
        raise DistrecError(f"cannot read {path}: {describe_error(e)}; check the file and --data-format") from None
    if b"\0" in head:
        raise DistrecError(f"{path} is a binary file, not delimited text; check --data and --data-format")


@contextmanager
def _reading(path: Path, fix: str) -> Iterator[None]:
    """Turn Arrow's read errors inside the block into one-line DistrecErrors naming ``path``.

    Arrow decodes a row with the wrong field count as UTF-8 before it calls the invalid-row
    handler; when that fails it prints an "Exception ignored" traceback and stops with a
    parse error. The hook here keeps that traceback off the terminal and says why instead.
    """
    undecodable: list[BaseException] = []
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, UnicodeDecodeError):
            undecodable.append(unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    except (pa.ArrowInvalid, OSError) as e:
        if undecodable:
            raise DistrecError(
                f"cannot read {path}: a line with the wrong number of fields is not UTF-8 text ({describe_error(e)}); fix or remove that line"
            ) from None
        raise DistrecError(f"cannot read {path}: {describe_error(e)}; {fix}") from None
    finally:
        sys.unraisablehook = previous


def _open(path, delimiter, quoted, column_names, column_types, include, encoding, block_size, on_invalid, stream=None):
    """A streaming CSV reader over ``path`` (or over ``stream``, its opened contents), None if it is empty."""
    _check_text(path)
    with _reading(path, "check the file and --data-format"):
        try:
            return _open_csv(path if stream is None else stream, delimiter, quoted, column_names, column_types, include, encoding, block_size, on_invalid)
        except pa.ArrowInvalid as e:
            if "Empty CSV file" in str(e):
                return None
            raise


def _open_csv(source, delimiter, quoted, column_names, column_types, include, encoding, block_size, on_invalid):
    """Arrow's streaming CSV reader with distrec's options (every row-level problem to ``on_invalid``)."""
    return pacsv.open_csv(
        source,
        read_options=pacsv.ReadOptions(column_names=column_names, use_threads=False, block_size=block_size, encoding=encoding),
        parse_options=pacsv.ParseOptions(
            delimiter=delimiter,
            quote_char='"' if quoted else False,
            ignore_empty_lines=False,
            invalid_row_handler=on_invalid,
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=column_types,
            include_columns=include,
            strings_can_be_null=True,
            null_values=[""],
            check_utf8=False,
        ),
    )


class CsvStream:
    """Record batches of at most ``chunk_rows`` rows from a delimited text file.

    Rows with the wrong number of columns are skipped and recorded in ``malformed``; the
    physical line number (1-based, the header counts) of any kept row is available from
    :meth:`line_numbers`. Every column listed in ``text_columns`` is read as text (the
    caller parses it); the others get Arrow's inferred types.

    Args:
        path: the file; ``.gz`` (or another extension Arrow knows) is decompressed.
        delimiter: one character.
        quoted: whether fields may be enclosed in double quotes.
        malformed: where skipped rows are counted.
        chunk_rows: the most rows per yielded batch.
        column_names: names for a file without a header line, or None to read the header.
        include: the columns to keep (all if None).
        text_columns: columns read as text (not checked to be valid UTF-8).
        encoding: the file's text encoding.
    """

    def __init__(
        self,
        path: Path,
        delimiter: str,
        quoted: bool,
        malformed: MalformedRows,
        chunk_rows: int,
        column_names: list[str] | None = None,
        include: list[str] | None = None,
        text_columns: list[str] = (),
        encoding: str = "utf8",
    ) -> None:
        self.path = path
        self.delimiter = delimiter
        self.quoted = quoted
        self.malformed = malformed
        self.chunk_rows = chunk_rows
        self.column_names = column_names
        self.include = include
        self.text_columns = list(text_columns)
        self.encoding = encoding
        self._skipped: list[int] = []
        self._header_lines = 0 if column_names is not None else 1
        self._raw: pa.NativeFile | None = None  # the file being read
        self._text_bytes = 0  # bytes of the fields (and their delimiters) yielded so far

    def _on_invalid(self, row) -> str:
        self._skipped.append(row.number)
        self.malformed.add([row.number], f"{row.actual_columns} columns instead of {row.expected_columns}")
        return "skip"

    def __iter__(self) -> Iterator[tuple[pa.RecordBatch, int]]:
        """Yield (batch, index of its first row among all rows kept so far)."""
        block = int(np.clip(self.chunk_rows * _BYTES_PER_ROW, _MIN_BLOCK_BYTES, _MAX_BLOCK_BYTES))
        types = {name: pa.string() for name in self.text_columns}
        with pa.OSFile(str(self.path)) as raw:
            self._raw = raw
            stream = pa.CompressedInputStream(raw, _CODECS[self.path.suffix]) if self.path.suffix in _CODECS else raw
            reader = _open(self.path, self.delimiter, self.quoted, self.column_names, types, self.include, self.encoding, block, self._on_invalid, stream)
            if reader is not None:
                yield from self._batches(reader)
        self._raw = None

    def fraction_read(self) -> float:
        """About how much of the file the batches so far hold (0 to 1), e.g. to extrapolate sizes.

        A plain file counts the text of the batches' fields plus one delimiter each (exact
        when every column is read); a compressed file counts compressed bytes read, which
        runs ahead of the batches by the reader's read-ahead.
        """
        if self._raw is None or self._raw.closed:
            return 1.0 if self._text_bytes else 0.0
        size = max(self._raw.size(), 1)
        read = self._raw.tell() if self.path.suffix in _CODECS else self._text_bytes
        return min(read / size, 1.0)

    def _batches(self, reader) -> Iterator[tuple[pa.RecordBatch, int]]:
        first = 0
        with reader:
            while True:
                try:
                    with _reading(self.path, "check the file"):
                        batch = reader.read_next_batch()
                except StopIteration:
                    return
                for start in range(0, batch.num_rows, self.chunk_rows):
                    part = batch.slice(start, self.chunk_rows)
                    self._text_bytes += _text_bytes(part)
                    yield part, first
                    first += part.num_rows

    def line_numbers(self, rows: np.ndarray) -> np.ndarray:
        """1-based line numbers of kept rows given their indices among all rows kept so far."""
        rows = np.asarray(rows, np.int64)
        skipped = np.sort(np.asarray(self._skipped, np.int64))
        base = rows + 1 + self._header_lines
        lines = base
        while True:  # a fixed point: each skipped line at or before a row pushes it down one line
            moved = base + np.searchsorted(skipped, lines, side="right")
            if np.array_equal(moved, lines):
                return lines
            lines = moved


def _text_bytes(batch: pa.RecordBatch) -> int:
    """Bytes of the text fields of ``batch`` plus one delimiter (or newline) per field."""
    total = batch.num_rows * batch.num_columns
    for column in batch.columns:
        if pa.types.is_string(column.type) or pa.types.is_binary(column.type):
            offsets = column.buffers()[1]
            ends = np.frombuffer(offsets, np.int32)[column.offset : column.offset + len(column) + 1]
            total += int(ends[-1] - ends[0]) if len(ends) else 0
    return total
