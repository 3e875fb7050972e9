"""Streaming a delimited text file (plain or compressed, local or remote) in bounded memory,
keeping line numbers.

The text is read in blocks of whole lines and Arrow's CSV reader parses each block on its
own, so a block whose typed columns do not convert (a count that is not an integer) is
parsed again with those columns as text, for the caller to check value by value, while
every other block keeps the fast typed parse. Blocks split at newlines, as Arrow's own
reader does: a quoted field must not hold a line break. A part of a plain file (a byte
range, for parallel preparation) is the lines that start inside the range, so the parts
of a file hold each line exactly once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from distrec.data.filesystems import Location, locate, open_random_access
from distrec.data.inputs import CODECS
from distrec.data.source import MalformedRows, describe_error
from distrec.errors import DistrecError

# Bytes of text read at a time for each row wanted in a chunk, within these bounds (whole
# lines: a longer line makes a longer block).
BYTES_PER_ROW = 256
_MIN_BLOCK_BYTES = 1 << 20
_MAX_BLOCK_BYTES = 1 << 24  # larger blocks parse slower (their columns no longer fit the caches)
# Bytes Arrow parses at a time inside a block: smaller blocks parse faster (their columns
# stay in the caches).
_PARSE_BLOCK_BYTES = 1 << 20
# Bytes at the start of a file or part checked for NUL bytes (binary content).
_SNIFF_BYTES = 1 << 16
# Bytes read at a time while looking for the end of a line.
_SCAN_BYTES = 1 << 16

LineNumbers = Callable[[np.ndarray], np.ndarray]
"""Maps row indices of a batch (int64 [k]) to their 1-based line numbers in the file."""


@dataclass(frozen=True)
class ByteRange:
    """The lines of a plain file that start in bytes [start, stop)."""

    start: int
    stop: int


def read_header(path: str | Path, delimiter: str, encoding: str = "utf8") -> list[str]:
    """The column names on the first line of a delimited file (fields may be quoted)."""
    location = locate(path)
    with _reading(location.uri, "check the file and --data-format", 0), _open_stream(location) as stream:
        first = stream.read(_MIN_BLOCK_BYTES)
    _check_text(location.uri, first)
    line = first.split(b"\n", 1)[0]
    if not line.strip():
        raise DistrecError(f"{location.uri} is empty; check --data")
    with _reading(location.uri, "check the file and --data-format", 0):
        table = pacsv.read_csv(
            pa.BufferReader(line + b"\n"),
            read_options=pacsv.ReadOptions(use_threads=False, encoding=encoding),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
        )
    return list(table.schema.names)


def _check_text(name: str, head: bytes) -> None:
    """DistrecError if ``head`` (the first bytes of ``name``, decompressed) looks binary.

    Text formats never hold a NUL byte in their first block; binary files (images,
    executables, Parquet, a cache file) almost always do.
    """
    if b"\0" in head[:_SNIFF_BYTES]:
        raise DistrecError(f"{name} is a binary file, not delimited text; check --data and --data-format")


@contextmanager
def _reading(name: str, fix: str, line: int | None) -> Iterator[None]:
    """Turn Arrow's read errors inside the block into one-line DistrecErrors naming ``name``
    (and the line reached, when given and past the first).

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
        where = f" after line {line:,}" if line else ""
        if undecodable:
            raise DistrecError(
                f"cannot read {name}{where}: a line with the wrong number of fields is not UTF-8 text ({describe_error(e)}); fix or remove that line"
            ) from None
        raise DistrecError(f"cannot read {name}{where}: {describe_error(e)}; {fix}") from None
    finally:
        sys.unraisablehook = previous


@contextmanager
def _open_stream(location: Location) -> Iterator[pa.NativeFile]:
    """The file's bytes, decompressed when its extension names a codec."""
    with open_random_access(location) as raw:
        codec = CODECS.get(Path(location.path).suffix.lower())
        if codec is None:
            yield raw
        else:
            with pa.CompressedInputStream(raw, codec) as stream:
                yield stream


def line_start(file: pa.NativeFile, position: int) -> int:
    """The offset of the first line of ``file`` that starts at or after ``position`` (0 stays
    0; the file's size when no line starts there)."""
    if position <= 0:
        return 0
    offset = position - 1  # a line starts at position when the byte before it ends a line
    while True:
        window = file.read_at(_SCAN_BYTES, offset)
        if not window:
            return offset
        found = window.find(b"\n")
        if found >= 0:
            return offset + found + 1
        offset += len(window)


class CsvStream:
    """Record batches of at most ``chunk_rows`` rows from a delimited text file.

    Rows with the wrong number of columns are skipped and recorded in ``malformed``; each
    batch comes with the function that gives its rows' physical line numbers (1-based, a
    header counts). Columns in ``typed_columns`` are converted by the parser (a block where
    one fails is parsed again with it as text); those in ``text_columns`` are read as text
    (not checked to be valid UTF-8); the others get Arrow's inferred types.

    Args:
        path: a local path or URL; ``.gz`` (or another extension in ``CODECS``) is decompressed.
        delimiter: one character.
        quoted: whether fields may be enclosed in double quotes.
        malformed: where skipped rows are counted.
        chunk_rows: the most rows per yielded batch.
        column_names: names for a file without a header line, or None to read the header.
        include: the columns to keep (all if None).
        text_columns: columns read as text.
        typed_columns: columns the parser converts, by name (read as text in a block where
            one does not convert).
        encoding: the file's text encoding.
        byte_range: read only the lines that start in this range of a plain file; line
            numbers then count from the range's first line (the caller adds the lines before).
        header: whether the file starts with a header line (default: when ``column_names`` is None).
    """

    def __init__(
        self,
        path: str | Path,
        delimiter: str,
        quoted: bool,
        malformed: MalformedRows,
        chunk_rows: int,
        column_names: list[str] | None = None,
        include: list[str] | None = None,
        text_columns: list[str] = (),
        typed_columns: dict[str, pa.DataType] | None = None,
        encoding: str = "utf8",
        byte_range: ByteRange | None = None,
        header: bool | None = None,
    ) -> None:
        self.location = locate(path)
        self.delimiter = delimiter
        self.quoted = quoted
        self.malformed = malformed
        self.chunk_rows = chunk_rows
        self.header = column_names is None if header is None else header
        self.column_names = column_names if column_names is not None else read_header(self.location.uri, delimiter, encoding)
        self.include = include
        self.encoding = encoding
        self.byte_range = byte_range
        typed_columns = typed_columns or {}
        self._text_types = {name: pa.string() for name in [*text_columns, *typed_columns]}  # the fallback of a block that does not convert
        self._typed = {**self._text_types, **typed_columns}
        self.lines = 0  # physical lines consumed so far
        self.bytes_read = 0  # bytes of the file (compressed bytes of a compressed file) behind the rows handed out
        self._size = 0
        self._block_start = self._block_end = 0  # bytes_read before and after the current block

    def __iter__(self) -> Iterator[tuple[pa.RecordBatch, LineNumbers]]:
        """Yield (batch, the line numbers of its rows)."""
        for block in self.blocks():
            yield from self.parse(block)

    def blocks(self) -> Iterator[pa.Buffer]:
        """The text in blocks of whole lines (the last may lack its newline), without a header
        line; each block must be handed to :meth:`parse` or counted by :meth:`count_lines`."""
        block_bytes = int(np.clip(self.chunk_rows * BYTES_PER_ROW, _MIN_BLOCK_BYTES, _MAX_BLOCK_BYTES))
        with open_random_access(self.location) as raw:
            codec = CODECS.get(Path(self.location.path).suffix.lower())
            if codec is None:
                yield from self._range_blocks(raw, block_bytes)
            elif self.byte_range is None:
                yield from self._stream_blocks(raw, codec, block_bytes)
            else:
                raise ValueError(f"{self.location.uri} is compressed: it is read whole, not in byte ranges")

    def count_lines(self, lines: int, done: int, block_lines: int) -> None:
        """Count ``lines`` lines of a block the caller parsed itself, ``done`` of its
        ``block_lines`` lines (none skipped) now handed out."""
        self.lines += lines
        self._hand_out(done, block_lines)

    def _hand_out(self, done: int, block_lines: int) -> None:
        """``done`` of the current block's ``block_lines`` lines are handed out: their share of
        its bytes is consumed."""
        share = done / block_lines if block_lines else 1.0
        self.bytes_read = self._block_start + round((self._block_end - self._block_start) * share)

    def fraction_read(self) -> float:
        """How much of the file (or range) the batches so far consumed (0 to 1): of its bytes
        on disk, so a compressed file counts compressed bytes."""
        return min(self.bytes_read / self._size, 1.0) if self._size else 0.0

    def _range_blocks(self, raw: pa.NativeFile, block_bytes: int) -> Iterator[pa.Buffer]:
        """The blocks of a plain file or of its byte range, read in place (no copy but the read)."""
        with self._errors():
            size = raw.size()
            whole = self.byte_range or ByteRange(0, size)
            start = line_start(raw, whole.start)
            stop = line_start(raw, whole.stop) if whole.stop < size else size
        self._size, position = stop - start, start
        while position < stop:
            with self._errors():
                data = pa.py_buffer(raw.read_at(min(block_bytes, stop - position), position))
            if position == start:
                _check_text(self.location.uri, data.slice(0, min(_SNIFF_BYTES, data.size)).to_pybytes())
            cut = _after_last_newline(data)
            if cut == 0 and position + data.size < stop:  # a line longer than a block: read more
                block_bytes *= 2
                continue
            block = data.slice(0, cut or data.size)
            if position == 0 and self.header:
                block = self._skip_header(block)
            position += cut or data.size
            self._block_start, self._block_end = self._block_end, position - start
            yield block

    def _stream_blocks(self, raw: pa.NativeFile, codec: str, block_bytes: int) -> Iterator[pa.Buffer]:
        """The blocks of a compressed file, decompressed as they are read."""
        self._size = raw.size()
        stream = pa.CompressedInputStream(raw, codec)
        carry, first = b"", True
        while True:
            with self._errors():
                data = stream.read(block_bytes)
            self._block_start, self._block_end = self._block_end, raw.tell()
            if first and data:
                _check_text(self.location.uri, data[:_SNIFF_BYTES])
            if not data:
                if carry:
                    yield self._skip_header(pa.py_buffer(carry)) if first and self.header else pa.py_buffer(carry)
                return
            data = carry + data if carry else data
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # a line longer than a block: read on
                carry = data
                continue
            block, carry = pa.py_buffer(data).slice(0, cut), data[cut:]
            if first and self.header:
                block = self._skip_header(block)
            first = False
            yield block

    def _skip_header(self, block: pa.Buffer) -> pa.Buffer:
        """``block`` without its first line (the header), which is counted."""
        end = block.to_pybytes().find(b"\n")
        self.lines += 1
        return block.slice(end + 1) if end >= 0 else block.slice(block.size)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Read errors as one line naming the file and the line reached."""
        with _reading(self.location.uri, "check the file", self.lines):
            yield

    def parse(self, block: pa.Buffer) -> Iterator[tuple[pa.RecordBatch, LineNumbers]]:
        """The rows of one block in batches of at most ``chunk_rows``, with their line numbers;
        the block's lines are counted."""
        first_line = self.lines
        with self._errors():
            try:
                table, invalid = self._read_block(block, self._typed)
            except pa.ArrowInvalid as e:
                if "conversion error" not in str(e) or self._typed == self._text_types:
                    raise
                table, invalid = self._read_block(block, self._text_types)
        for number, found in invalid:
            self.malformed.add([first_line + number], f"{found} columns instead of {len(self.column_names)}")
        self.lines += table.num_rows + len(invalid)
        skipped = [number for number, _ in invalid]
        kept = 0  # rows of the block before the batch
        for batch in table.to_batches(max_chunksize=self.chunk_rows):
            self._hand_out(kept + batch.num_rows, table.num_rows)
            yield batch, (lambda rows, kept=kept: first_line + _lines_of_rows(np.asarray(rows, np.int64) + kept, skipped))
            kept += batch.num_rows
        self._hand_out(1, 1)  # a block of skipped lines only

    def _read_block(self, block: pa.Buffer, types: dict[str, pa.DataType]) -> tuple[pa.Table, list[tuple[int, int]]]:
        """Parse one block; its rows with the wrong field count as (line within the block, fields)."""
        invalid: list[tuple[int, int]] = []

        def on_invalid(row) -> str:
            invalid.append((row.number, row.actual_columns))
            return "skip"

        table = pacsv.read_csv(
            pa.BufferReader(block),
            read_options=pacsv.ReadOptions(column_names=self.column_names, use_threads=False, block_size=_PARSE_BLOCK_BYTES, encoding=self.encoding),
            parse_options=pacsv.ParseOptions(
                delimiter=self.delimiter,
                quote_char='"' if self.quoted else False,
                ignore_empty_lines=False,
                invalid_row_handler=on_invalid,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                include_columns=self.include,
                strings_can_be_null=True,
                null_values=[""],
                check_utf8=False,
            ),
        )
        return table, invalid


def _after_last_newline(data: pa.Buffer) -> int:
    """The offset just past the last newline of ``data`` (0 when it holds none)."""
    view = np.frombuffer(data, np.uint8)
    tail = max(view.size - _SCAN_BYTES, 0)
    while True:
        found = np.flatnonzero(view[tail:] == 10)
        if found.size:
            return tail + int(found[-1]) + 1
        if tail == 0:
            return 0
        tail = max(tail - _SCAN_BYTES, 0)


def _lines_of_rows(rows: np.ndarray, skipped: list[int]) -> np.ndarray:
    """1-based lines within a block of its kept rows ``rows``, given the lines it skipped."""
    skipped_lines = np.sort(np.asarray(skipped, np.int64))
    base = np.asarray(rows, np.int64) + 1
    lines = base
    while True:  # a fixed point: each skipped line at or before a row pushes it down one line
        moved = base + np.searchsorted(skipped_lines, lines, side="right")
        if np.array_equal(moved, lines):
            return lines
        lines = moved
