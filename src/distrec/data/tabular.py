"""User data as CSV or Parquet, described by a small YAML schema.

Example schema::

    label: rating          # the label column
    threshold: 4           # optional: label = value >= threshold (else the column is 0/1)
    dense:                 # numeric columns; missing = 0
      - age                #   transformed as `auto` decides (distrec.data.dense_transforms)
      - {name: price, transform: log1p}   # or standardize, none, auto
    categorical:           # hashed columns; a separator makes a multi-valued column
      - user_id
      - {name: genres, separator: "|"}
    delimiter: ","         # CSV only (default ",")
    header: true           # CSV only; with false, list the names under `columns:`

Categorical values are hashed (64-bit FNV-1a of their text) to raw ids >= 1; empty = 0. A
Parquet list column is multi-valued without a separator.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from distrec.data.columns import bags, hash_strings, parse_numbers
from distrec.data.dense_transforms import TRANSFORMS
from distrec.data.filesystems import locate, open_random_access
from distrec.data.inputs import input_file
from distrec.data.source import Chunk, MalformedRows, RowCheck, Source, SparseFeature, describe_error, existing_path, single_hot
from distrec.data.textfile import ByteRange, CsvStream, read_header
from distrec.errors import DistrecError

# Dense values are stored as float32: larger magnitudes would become infinite.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_SCHEMA_KEYS = ("label", "threshold", "dense", "categorical", "delimiter", "header", "columns")


@dataclass(frozen=True)
class CategoricalColumn:
    """A categorical column; ``separator`` splits a multi-valued text cell into a bag."""

    name: str
    separator: str | None = None


@dataclass(frozen=True)
class TabularSchema:
    """Which columns of a CSV or Parquet file are the label, dense and categorical features."""

    label: str
    threshold: float | None = None
    dense: tuple[str, ...] = ()
    dense_transforms: tuple[str, ...] = ()
    """The transform each dense column asks for (``distrec.data.dense_transforms.TRANSFORMS``)."""
    categorical: tuple[CategoricalColumn, ...] = ()
    delimiter: str = ","
    header: bool = True
    columns: tuple[str, ...] | None = None

    @property
    def used_columns(self) -> list[str]:
        return list(dict.fromkeys([self.label, *self.dense, *(c.name for c in self.categorical)]))


def load_schema(path: str | Path) -> TabularSchema:
    """Read and validate a YAML schema file; every problem is a one-line DistrecError."""
    path = existing_path(path, what="schema")
    try:
        d = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DistrecError(f"schema {path} is not valid YAML ({str(e).splitlines()[0]}); fix its syntax") from None

    def fail(problem: str) -> DistrecError:
        return DistrecError(f"schema {path}: {problem}; see distrec.data.tabular for an example schema")

    if not isinstance(d, dict):
        raise fail("it must be a mapping with at least a `label:` key")
    unknown = sorted(set(d) - set(_SCHEMA_KEYS))
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (known keys: {', '.join(_SCHEMA_KEYS)})")
    if not isinstance(d.get("label"), str) or not d["label"]:
        raise fail("`label:` must name the label column")

    def names(key: str) -> tuple[str, ...]:
        value = d.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise fail(f"`{key}:` must be a list of column names")
        return tuple(value)

    dense, transforms = [], []
    entries = d.get("dense") or []
    if not isinstance(entries, list):
        raise fail("`dense:` must be a list of column names or {name: ..., transform: ...}")
    for entry in entries:
        if isinstance(entry, str) and entry:
            dense.append(entry)
            transforms.append("auto")
        elif isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"] and set(entry) <= {"name", "transform"}:
            transform = entry.get("transform", "auto")
            if transform not in TRANSFORMS:
                raise fail(f"the transform of {entry['name']!r} is {transform!r}; choose one of {', '.join(TRANSFORMS)}")
            dense.append(entry["name"])
            transforms.append(transform)
        else:
            raise fail(f"dense entry {entry!r} must be a column name or {{name: ..., transform: ...}}")
    categorical = []
    for entry in d.get("categorical") or []:
        if isinstance(entry, str) and entry:
            categorical.append(CategoricalColumn(entry))
        elif isinstance(entry, dict) and isinstance(entry.get("name"), str) and set(entry) <= {"name", "separator"}:
            separator = entry.get("separator")
            if separator is not None and (not isinstance(separator, str) or not separator):
                raise fail(f"the separator of {entry['name']!r} must be a non-empty string")
            categorical.append(CategoricalColumn(entry["name"], separator))
        else:
            raise fail(f"categorical entry {entry!r} must be a column name or {{name: ..., separator: ...}}")
    threshold = d.get("threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
        raise fail(f"`threshold:` must be a number, not {threshold!r}")
    delimiter = d.get("delimiter", ",")
    if not isinstance(delimiter, str) or len(delimiter) != 1:
        raise fail(f"`delimiter:` must be one character, not {delimiter!r}")
    header = d.get("header", True)
    if not isinstance(header, bool):
        raise fail(f"`header:` must be true or false, not {header!r}")
    columns = names("columns") if "columns" in d else None
    if not header and not columns:
        raise fail("a file without a header needs `columns:` listing the column names in order")
    schema = TabularSchema(
        d["label"], None if threshold is None else float(threshold), tuple(dense), tuple(transforms), tuple(categorical), delimiter, header, columns
    )
    if not schema.dense and not schema.categorical:
        raise fail("name at least one `dense:` or `categorical:` column")
    named = [schema.label, *schema.dense, *(c.name for c in schema.categorical)]
    duplicated = [c for c in named if named.count(c) > 1]
    if duplicated:
        raise fail(f"column {duplicated[0]!r} is used twice")
    return schema


def read_tabular(
    path: str | Path, schema_path: str | Path, fmt: str, chunk_rows: int = 262_144, strict: bool = False, byte_range: ByteRange | None = None
) -> Source:
    """Stream a CSV (plain or compressed) or Parquet file, local or a URL, as chunks of at most
    ``chunk_rows`` rows.

    Rows with a missing or non-numeric label, a label that is not 0/1 (without a
    threshold), a dense value that is not a number or not finite in float32 (text ``nan``
    and ``inf``, ``1e39``), or (CSV) the wrong column count are skipped and counted; with
    ``strict`` the first one raises a DistrecError. A missing dense value is 0. With
    ``byte_range`` (CSV only) only the lines that start in it are read.
    """
    schema = load_schema(schema_path)
    uri = input_file(path).uri
    if fmt == "csv":
        malformed = MalformedRows(uri, strict)
        names = list(schema.columns) if not schema.header else read_header(uri, schema.delimiter)
        _check_columns(schema, names, uri, schema_path)
        stream = CsvStream(
            uri,
            schema.delimiter,
            True,
            malformed,
            chunk_rows,
            column_names=names,
            include=schema.used_columns,
            text_columns=schema.used_columns,
            byte_range=byte_range,
            header=schema.header,
        )
        batches = iter(stream)
        list_columns: set[str] = set()
        num_rows, fraction_read, lines_read = None, stream.fraction_read, lambda: stream.lines
    elif fmt == "parquet":
        malformed = MalformedRows(uri, strict, unit="row")
        try:
            parquet = pq.ParquetFile(open_random_access(locate(uri)))
        except (pa.ArrowInvalid, OSError) as e:
            raise DistrecError(f"cannot read {uri} as Parquet ({describe_error(e)}); check --data-format") from None
        arrow_schema = parquet.schema_arrow
        _check_columns(schema, arrow_schema.names, uri, schema_path)
        batches = _parquet_batches(parquet, uri, schema.used_columns, chunk_rows)
        list_columns = {
            c.name for c in schema.categorical if pa.types.is_list(arrow_schema.field(c.name).type) or pa.types.is_large_list(arrow_schema.field(c.name).type)
        }
        num_rows, fraction_read, lines_read = parquet.metadata.num_rows, None, None
    else:
        raise DistrecError(f"unknown tabular format {fmt!r}; choose csv or parquet")
    features = [SparseFeature(c.name, multi_hot=c.separator is not None or c.name in list_columns) for c in schema.categorical]
    return Source(
        description={"format": fmt, "path": uri, "schema": str(Path(schema_path).resolve()), "dense_transforms": list(schema.dense_transforms)},
        label=schema.label,
        dense=list(schema.dense),
        features=features,
        chunks=_chunks(batches, schema, features, malformed),
        malformed=malformed,
        num_rows=num_rows,
        fraction_read=fraction_read,
        lines_read=lines_read,
        header_lines=int(fmt == "csv" and schema.header),
    )


def _check_columns(schema: TabularSchema, names: list[str], path: str, schema_path: str | Path) -> None:
    missing = [c for c in schema.used_columns if c not in names]
    if missing:
        shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
        raise DistrecError(f"schema {schema_path} names column {missing[0]!r}, which is not in {path} (columns: {shown}); fix the schema")


def _parquet_batches(parquet: pq.ParquetFile, path: str, columns: list[str], chunk_rows: int):
    """(batch, row numbers of its rows) pairs; a corrupt page is a DistrecError naming the row reached."""
    first = 0
    batches = parquet.iter_batches(batch_size=chunk_rows, columns=columns)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise DistrecError(f"{path} is corrupt after row {first} ({describe_error(e)}); re-export the Parquet file") from None
        yield batch, lambda rows, first=first: first + rows + 1
        first += batch.num_rows


def _chunks(batches, schema: TabularSchema, features: list[SparseFeature], malformed: MalformedRows) -> Iterator[Chunk]:
    for batch, line_numbers in batches:
        check = RowCheck(batch.num_rows)
        value, bad = parse_numbers(batch.column(schema.label))
        check.flag(bad | np.isnan(value), f"the label {schema.label!r} is missing or not a number")
        if schema.threshold is not None:
            label = value >= schema.threshold
        else:
            label = value == 1.0
            check.flag(
                ~np.isnan(value) & ~np.isin(value, (0.0, 1.0)), f"the label {schema.label!r} is not 0 or 1 (set `threshold:` in the schema for a rating)"
            )
        dense = np.empty((batch.num_rows, len(schema.dense)), np.float32)
        for j, name in enumerate(schema.dense):
            values, bad = parse_numbers(batch.column(name))
            check.flag(bad, f"{name!r} is not a finite number")
            too_large = np.abs(values) > _FLOAT32_MAX
            check.flag(too_large, f"{name!r} is beyond float32's range (3.4e38)")
            dense[:, j] = np.where(too_large | np.isnan(values), 0.0, values)
        keep = check.report(malformed, line_numbers)
        if keep.size < batch.num_rows:
            batch = batch.take(pa.array(keep))
        sparse = [
            bags(batch.column(c.name), c.separator) if f.multi_hot else single_hot(hash_strings(batch.column(c.name)))
            for c, f in zip(schema.categorical, features)
        ]
        yield Chunk(dense[keep], label[keep].astype(np.float32), sparse)
