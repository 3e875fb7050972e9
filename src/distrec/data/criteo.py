"""The Criteo Kaggle / Terabyte click logs: raw TSV (or .gz), read and written.

A line is ``label, I1..I13, C1..C26`` separated by tabs, without a header: the label is 0
or 1, the I columns are integer counts (possibly empty or negative), the C columns are
32-bit hashes as 8 hex digits (possibly empty). Dense features are ``log(1 + max(x, 0))``
with missing = 0, as in the DLRM reference preprocessing; a hash ``h`` becomes raw id
``h + 1`` (0 stays "missing").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from distrec.data.columns import MAX_HEX_DIGITS, parse_hex, parse_numbers
from distrec.data.inputs import input_file
from distrec.data.source import Chunk, MalformedRows, RowCheck, Source, SparseFeature
from distrec.data.textfile import ByteRange, CsvStream, LineNumbers
from distrec.errors import DistrecError

NUM_DENSE = 13
NUM_SPARSE = 26
LABEL = "label"
DENSE_NAMES = [f"I{i}" for i in range(1, NUM_DENSE + 1)]
SPARSE_NAMES = [f"C{i}" for i in range(1, NUM_SPARSE + 1)]
COLUMNS = [LABEL, *DENSE_NAMES, *SPARSE_NAMES]
# The shortest line: a label and 39 tabs (every other field empty), without its newline.
_MIN_LINE_BYTES = 40
# Raw ids written as 8 hex digits must stay below 2**32 + 1.
_MAX_RAW_ID = 1 << 32


def read_criteo(path: str | Path, chunk_rows: int = 262_144, strict: bool = False, byte_range: ByteRange | None = None) -> Source:
    """Stream a Criteo TSV (plain or compressed, local or a URL) as chunks of at most ``chunk_rows`` rows.

    Rows with the wrong column count, a non-integer label or count, a label other than 0/1,
    or a categorical value that is not hex are skipped and counted; with ``strict`` the
    first one raises a DistrecError naming the file and line. With ``byte_range`` only the
    lines that start in it are read (their line numbers count from the range's first line).
    """
    uri = input_file(path).uri
    malformed = MalformedRows(uri, strict)
    counts = {name: pa.int64() for name in [LABEL, *DENSE_NAMES]}  # the parser converts them; hashes stay text
    stream = CsvStream(uri, "\t", False, malformed, chunk_rows, column_names=COLUMNS, text_columns=SPARSE_NAMES, typed_columns=counts, byte_range=byte_range)
    return Source(
        description={"format": "criteo", "path": uri},
        label=LABEL,
        dense=list(DENSE_NAMES),
        features=[SparseFeature(name) for name in SPARSE_NAMES],
        chunks=_chunks(stream),
        malformed=malformed,
        fraction_read=stream.fraction_read,
        lines_read=lambda: stream.lines,
    )


def _chunks(stream: CsvStream) -> Iterator[Chunk]:
    """Each block through the compiled parser, or, when a line is not clean, through Arrow's."""
    for block in stream.blocks():
        clean = _parse_clean(block)
        if clean is None:
            for batch, line_numbers in stream.parse(block):
                yield _convert(batch, line_numbers, stream.malformed)
            continue
        labels, dense, raw = clean
        for start in range(0, labels.size, stream.chunk_rows):
            end = min(start + stream.chunk_rows, labels.size)
            stream.count_lines(end - start, end, labels.size)
            ones = np.ones(end - start, np.int32)  # every feature's bag lengths, shared
            yield Chunk(dense[start:end], labels[start:end], [(values[start:end], ones) for values in raw])


def load_parsers() -> None:
    """Load the compiled parsers now (numba compiles them, or loads them from its cache: half a
    second), e.g. before forking workers that would each load them again."""
    _parse_clean(pa.py_buffer(b"1" + b"\t" * 39 + b"\n"))
    for column in (pa.array(["0"]), pa.array(["0", None])):
        parse_hex(column)


def _parse_clean(block: pa.Buffer) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Labels float32 [n], dense float32 [n, 13] and raw ids int64 [26, n] of a block whose
    every line is clean (``text_kernels.parse_clean_criteo``), else None; the same values as
    Arrow's parse and :func:`_convert` give."""
    from distrec.data.text_kernels import parse_clean_criteo  # numba loads on first use

    data = np.frombuffer(block, np.uint8)
    capacity = data.size // _MIN_LINE_BYTES + 1
    labels, counts, raw = np.empty(capacity, np.float32), np.empty((capacity, NUM_DENSE)), np.empty((NUM_SPARSE, capacity), np.int64)
    rows = parse_clean_criteo(data, MAX_HEX_DIGITS, labels, counts, raw)
    if rows < 0:
        return None
    dense = np.log1p(counts[:rows], out=counts[:rows]).astype(np.float32)  # as _convert: log(1 + max(count, 0)) in float64
    return labels[:rows], dense, raw[:, :rows]


def _convert(batch: pa.RecordBatch, line_numbers: LineNumbers, malformed: MalformedRows) -> Chunk:
    """The good rows of a batch parsed by Arrow (counts as int64 or, where one did not convert, text)."""
    check = RowCheck(batch.num_rows)
    label, bad = parse_numbers(batch.column(0), integer=True)
    check.flag(bad, "the label is not an integer")
    check.flag(~np.isin(label, (0.0, 1.0)), "the label is missing or not 0/1")
    dense = np.empty((batch.num_rows, NUM_DENSE), np.float32)
    for j in range(NUM_DENSE):
        values, bad = parse_numbers(batch.column(1 + j), integer=True)
        check.flag(bad, f"{DENSE_NAMES[j]} is not an integer")
        values = np.nan_to_num(values, nan=0.0)  # a writable copy
        np.maximum(values, 0.0, out=values)
        dense[:, j] = np.log1p(values, out=values)
    raw = np.empty((NUM_SPARSE, batch.num_rows), np.int64)
    for f in range(NUM_SPARSE):
        raw[f], bad = parse_hex(batch.column(1 + NUM_DENSE + f))
        check.flag(bad, f"{SPARSE_NAMES[f]} is not a hex hash")
    keep = check.report(malformed, line_numbers)
    if keep.size == batch.num_rows:
        keep = slice(None)
    ones = np.ones(raw[:, keep].shape[1], np.int32)  # every feature's bag lengths, shared
    return Chunk(dense[keep], label[keep].astype(np.float32), [(raw[f][keep], ones) for f in range(NUM_SPARSE)])


class CriteoWriter:
    """Writes chunks as Criteo TSV lines, gzip-compressed if ``gzip`` (default: a ``.gz`` path).

    Dense values are written back as the integer counts they encode (``exp(x) - 1``,
    rounded), raw ids as the 8-hex-digit hash ``raw - 1``; reading the file with
    :func:`read_criteo` gives the same chunk back.
    """

    def __init__(self, path: str | Path, gzip: bool | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if gzip is None:
            gzip = path.suffix == ".gz"
        self._sink = pa.CompressedOutputStream(str(path), "gzip") if gzip else pa.OSFile(str(path), "wb")
        self._options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")

    def write(self, chunk: Chunk) -> None:
        if chunk.dense.shape[1] != NUM_DENSE or len(chunk.sparse) != NUM_SPARSE:
            raise DistrecError(
                f"a Criteo file holds {NUM_DENSE} dense and {NUM_SPARSE} categorical features, not "
                f"{chunk.dense.shape[1]} and {len(chunk.sparse)}; set synthetic.num_dense=13 and num_sparse=26"
            )
        columns = [pa.array(chunk.labels.astype(np.int8))]
        counts = np.rint(np.expm1(chunk.dense.astype(np.float64))).astype(np.int64)
        columns += [pa.array(counts[:, j]) for j in range(NUM_DENSE)]
        for values, lengths in chunk.sparse:
            if values.shape[0] != chunk.num_rows or np.any(lengths != 1):
                raise DistrecError("a Criteo file holds one value per categorical feature; set synthetic.pooling_factor=1")
            columns.append(_hex_column(values))
        pacsv.write_csv(pa.Table.from_arrays(columns, names=COLUMNS), self._sink, self._options)

    def close(self) -> None:
        self._sink.close()

    def __enter__(self) -> CriteoWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _hex_column(raw: np.ndarray) -> pa.Array:
    """Raw ids as 8-hex-digit strings of ``raw - 1`` (empty where raw is 0), built from buffers."""
    if raw.size and (raw.min() < 0 or raw.max() > _MAX_RAW_ID):
        raise DistrecError(f"raw ids up to {int(raw.max())} do not fit 8 hex digits; use at most {_MAX_RAW_ID} table rows")
    present = raw > 0
    value = (raw - 1).astype(np.uint64)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)[(value[:, None] >> shifts) & np.uint64(15)]
    lengths = np.where(present, 8, 0)
    offsets = np.zeros(raw.size + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = digits[present].tobytes()
    return pa.Array.from_buffers(pa.string(), raw.size, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
