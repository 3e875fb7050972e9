"""The identity of the data a run trains on, so that a resume on different data is refused.

:func:`fingerprint` records what decides which rows a run sees and which embedding rows
they map to: the absolute input paths (or URLs), each input file's size and a hash of sampled
blocks of it, and the data settings (format, schema, split, ``max_ind_range``,
``table_sizes``, the synthetic generator's parameters). :func:`check_same_data` compares
a saved fingerprint with the current one and names the first difference on one line.
A run keeps its fingerprint in ``RUN/data.json``.

Why size plus sampled blocks: hashing a whole 45 GB Criteo day would take minutes at
every resume; the modification time changes with a plain copy or ``touch`` that leave
the rows as they were (a false refusal), while the size changes when rows are added or
removed, and 16 blocks of 64 KiB (the first, the last and evenly spaced ones between;
about 1 MiB read, the whole file when it is smaller) catch most same-size edits. An
edit that keeps the size and falls outside every sampled block goes unnoticed. A hash
of the prepared cache's manifest was the alternative, but the manifest holds only
counts (rows, nonzeros, skipped rows), so it misses any edit that keeps them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Any

from distrec.config import DataConfig, SyntheticConfig
from distrec.data.filesystems import open_random_access
from distrec.data.inputs import InputFile, absolute_paths, input_files
from distrec.data.source import existing_path
from distrec.errors import DistrecError
from distrec.io import atomic_write_json, read_json

FINGERPRINT_VERSION = 1
DATA_FILE = "data.json"
SAMPLED_BLOCKS = 16
BLOCK_BYTES = 1 << 16

log = logging.getLogger(__name__)


def resolve_paths(data: DataConfig) -> None:
    """Make ``data.path`` (each of its names; URLs stay as they are), ``data.schema`` and
    ``data.cache_dir`` absolute (in place), so a saved config means the same files from any
    working directory.

    Raises DistrecError naming the path as given when an input file is missing.
    """
    input_files(data)
    data.path = absolute_paths(data.path)
    for key in ("schema", "cache_dir"):
        value = getattr(data, key)
        if value is not None:
            setattr(data, key, str(Path(value).expanduser().resolve()))


def sampled_hash(file: InputFile) -> str:
    """SHA-256 of :data:`SAMPLED_BLOCKS` blocks of :data:`BLOCK_BYTES` spread over ``file``
    (first and last included), or of the whole file when it is no larger than that."""
    digest = hashlib.sha256()
    with open_random_access(file.location()) as f:
        if file.size <= SAMPLED_BLOCKS * BLOCK_BYTES:
            digest.update(f.read_at(file.size, 0))
        else:
            last = file.size - BLOCK_BYTES
            for k in range(SAMPLED_BLOCKS):
                digest.update(f.read_at(BLOCK_BYTES, last * k // (SAMPLED_BLOCKS - 1)))
    return digest.hexdigest()


def fingerprint(data: DataConfig) -> dict[str, Any]:
    """What identifies the rows of ``data`` and their table mapping, as plain JSON.

    ``settings`` holds the data settings with absolute paths; ``files`` one entry per input
    file (and the schema): path, size in bytes, modification time (ns; informative only,
    not compared) and :func:`sampled_hash`.
    """
    settings: dict[str, Any] = {
        "format": data.format,
        "path": absolute_paths(data.path),
        "schema": None if data.schema is None else str(Path(data.schema).expanduser().resolve()),
        "split": data.split,
        "max_ind_range": data.max_ind_range,
        "table_sizes": dict(sorted(data.table_sizes.items())),
    }
    if data.format == "synthetic":
        settings["synthetic"] = dataclasses.asdict(data.synthetic)
    files = input_files(data)
    if data.schema is not None and data.format in ("csv", "parquet"):
        schema = existing_path(data.schema, what="schema")
        files.append(InputFile(str(schema), schema.stat().st_size, schema.stat().st_mtime_ns))
    return {
        "version": FINGERPRINT_VERSION,
        "settings": settings,
        "files": [{"path": f.uri, "size": f.size, "mtime_ns": f.mtime_ns, "sampled_sha256": sampled_hash(f)} for f in files],
    }


def check_same_data(saved: dict[str, Any], current: dict[str, Any], doing: str = "resume") -> None:
    """Raise a one-line DistrecError naming the first difference between two fingerprints
    (``doing``: what would use the different data, e.g. ``resume``)."""

    def refuse(what: str) -> DistrecError:
        return DistrecError(f"cannot {doing} on different data: {what}; restore it, or train a new run with --out")

    if saved.get("version") != current["version"]:
        raise DistrecError(f"the run's {DATA_FILE} has version {saved.get('version')!r}, this distrec writes {current['version']}; train a new run with --out")
    before, now = saved.get("settings", {}), current["settings"]
    if isinstance(before.get("synthetic"), dict):  # a generator setting added since the run started takes its default
        before = {**before, "synthetic": {**dataclasses.asdict(SyntheticConfig()), **before["synthetic"]}}
    for key, value in now.items():
        if before.get(key) != value:
            raise refuse(f"data.{key} was {before.get(key)!r} when the run started and is {value!r} now")
    files_before = {f["path"]: f for f in saved.get("files", [])}
    for f in current["files"]:
        old = files_before.get(f["path"])
        if old is None:
            raise refuse(f"the run did not read {f['path']}")
        if old["size"] != f["size"]:
            raise refuse(f"{f['path']} changed since the run started ({old['size']:,} bytes then, {f['size']:,} now)")
        if old["sampled_sha256"] != f["sampled_sha256"]:
            raise refuse(f"{f['path']} changed since the run started (same size, different content)")


def save_fingerprint(run_dir: Path, data: DataConfig) -> None:
    """Write ``data``'s fingerprint as ``run_dir/data.json`` (atomically)."""
    atomic_write_json(Path(run_dir) / DATA_FILE, fingerprint(data))


def check_run_data(run_dir: Path, data: DataConfig) -> None:
    """Refuse (DistrecError) to resume ``run_dir`` when ``data`` is not the data it trained on.

    A run from before fingerprints were kept has no ``data.json``: it gets one now (from
    the current data, with a warning), so its later resumes are checked.
    """
    path = Path(run_dir) / DATA_FILE
    if not path.is_file():
        log.warning(f"{run_dir} has no {DATA_FILE} (an older run): the data cannot be checked against the run's; recording it now")
        save_fingerprint(run_dir, data)
        return
    saved = read_json(path, "data fingerprint", f"restore {DATA_FILE} or train a new run with --out", f"restore {DATA_FILE} or train a new run with --out")
    if not isinstance(saved, dict):
        raise DistrecError(f"data fingerprint {str(path)!r} is not a JSON object; restore it or train a new run with --out")
    check_same_data(saved, fingerprint(data))


def check_scored_data(run_dir: Path, data: DataConfig) -> None:
    """Refuse (DistrecError) to score "the run's own rows" of ``run_dir`` when ``data`` is no
    longer the data it trained on (a run without ``data.json`` is not checked)."""
    path = Path(run_dir) / DATA_FILE
    if path.is_file():
        saved = read_json(path, "data fingerprint", "pass --data", "pass --data")
        if isinstance(saved, dict):
            check_same_data(saved, fingerprint(data), doing="score the run's own rows")
