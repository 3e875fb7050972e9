"""The input files a data path names, in the order their rows are read.

``data.path`` is a file, a directory (every file below it), a glob (``day_*.gz``,
``s3://bucket/clicks/part-*.parquet``; ``*``, ``?`` and ``[...]`` in any part of the path) or
a list of these, each local or a URL (``distrec.data.filesystems``). The files of a
directory or a glob are read in natural order (``day_2`` before ``day_10``), a list in its
own order. Directories skip names that start with ``.`` or ``_`` (``_SUCCESS``, ``.crc``
files), as Spark and Hadoop write them beside their parts.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow.fs as pafs

from distrec.config import DataConfig
from distrec.data.filesystems import Location, file_info, has_scheme, list_files, locate
from distrec.data.source import existing_path
from distrec.errors import DistrecError

# Compressed inputs by extension (the codecs Arrow's compressed streams read).
CODECS = {".bz2": "bz2", ".gz": "gzip", ".lz4": "lz4", ".zst": "zstd"}
_WILDCARD = re.compile(r"[*?[]")


@dataclass(frozen=True)
class InputFile:
    """One input file.

    Attributes:
        uri: an absolute local path, or a URL.
        size: bytes on disk (compressed bytes for a compressed file).
        mtime_ns: modification time in ns, None when the store keeps none.
    """

    uri: str
    size: int
    mtime_ns: int | None

    @property
    def name(self) -> str:
        return PurePosixPath(self.uri.rstrip("/")).name

    @property
    def compression(self) -> str | None:
        """The codec of a compressed file (by its extension), None for a plain one."""
        return CODECS.get(PurePosixPath(self.name).suffix.lower())

    def location(self) -> Location:
        return locate(self.uri)


def path_list(path: str | list[str] | None) -> list[str]:
    """``data.path`` as a list of names (empty when unset)."""
    if path is None:
        return []
    return [path] if isinstance(path, str) else list(path)


def absolute_paths(path: str | list[str] | None) -> str | list[str] | None:
    """``data.path`` in the same shape with each local name made absolute (URLs stay as they are)."""
    if path is None:
        return None
    names = [name if has_scheme(name) else str(Path(name).expanduser().resolve()) for name in path_list(path)]
    return names[0] if isinstance(path, str) else names


def describe_paths(path: str | list[str]) -> str:
    """``data.path`` in a message: the name, or the first and last of several."""
    names = path_list(path)
    return names[0] if len(names) == 1 else f"{len(names)} paths ({names[0]} ... {names[-1]})"


def list_inputs(path: str | list[str] | None) -> list[InputFile]:
    """The files ``path`` names, in reading order.

    Raises DistrecError naming the first missing file or directory, a glob no file matches,
    a directory without files, or a file named twice.
    """
    files: list[InputFile] = []
    for name in path_list(path):
        files += _expand(name)
    seen: set[str] = set()
    for f in files:
        if f.uri in seen:
            raise DistrecError(f"{f.uri} is named twice in --data; name each file once")
        seen.add(f.uri)
    return files


def input_file(name: str | Path) -> InputFile:
    """The one file ``name`` names; DistrecError when there is no such file."""
    location = locate(name)
    info = file_info(location)
    if info.type != pafs.FileType.File:
        raise DistrecError(f"data file {str(name)!r} not found; check --data")
    return _input(location.uri, info)


def input_files(cfg: DataConfig) -> list[InputFile]:
    """The files ``cfg`` is parsed from, in reading order (none for synthetic data).

    Raises DistrecError when the input or the schema is missing, or the settings do not
    name an input.
    """
    if cfg.format == "synthetic":
        if cfg.path is not None:
            raise DistrecError(
                "--data-format synthetic generates its data; drop --data, or read a file written by `distrec data synth` with --data-format criteo"
            )
        return []
    if cfg.path is None:
        raise DistrecError(f"--data-format {cfg.format} needs --data PATH")
    if cfg.format in ("csv", "parquet"):
        if cfg.schema is None:
            raise DistrecError(f"--data-format {cfg.format} needs --schema FILE naming the label, dense and categorical columns")
        existing_path(cfg.schema, what="schema")
    if cfg.format == "movielens":
        root = existing_path(movielens_directory(cfg), kind="directory")
        return list_inputs([str(root / name) for name in ("u.data", "u.user", "u.item")])
    return list_inputs(cfg.path)


def movielens_directory(cfg: DataConfig) -> str:
    """The one ml-100k directory a MovieLens data set is read from; DistrecError for several."""
    names = path_list(cfg.path)
    if len(names) != 1:
        raise DistrecError("--data-format movielens reads one ml-100k directory; pass one --data DIR")
    return names[0]


def natural_key(name: str) -> list[int | str]:
    """Sort key that orders the numbers inside names by value: day_2 before day_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _expand(name: str) -> list[InputFile]:
    """The files one entry of ``data.path`` names."""
    if _WILDCARD.search(_path_part(name)):
        return _glob(name)
    location = locate(name)
    info = file_info(location)
    if info.type == pafs.FileType.File:
        return [_input(location.uri, info)]
    if info.type == pafs.FileType.Directory:
        found = sorted(
            (info for info in list_files(location) if not _hidden(_relative(location.path, info.path))),
            key=lambda info: natural_key(_relative(location.path, info.path)),
        )
        if not found:
            raise DistrecError(f"directory {name!r} holds no data files; check --data")
        return [_input(location.child(info.path).uri, info) for info in found]
    raise DistrecError(f"data file {name!r} not found; check --data")


def _glob(name: str) -> list[InputFile]:
    """The files matching a pattern with wildcards, in natural order."""
    pattern = _path_part(name)
    parts = pattern.split("/")
    fixed = next(i for i, part in enumerate(parts) if _WILDCARD.search(part))
    base_name = name[: len(name) - len(pattern)] + ("/".join(parts[:fixed]) or ("/" if pattern.startswith("/") else "."))
    wanted = parts[fixed:]
    base = locate(base_name)
    if file_info(base).type != pafs.FileType.Directory:
        raise DistrecError(f"no file matches {name!r} ({base_name} is not a directory); check --data")
    matches = []
    for info in list_files(base, recursive=len(wanted) > 1):
        relative = _relative(base.path, info.path).split("/")
        if len(relative) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(relative, wanted)):
            matches.append(info)
    if not matches:
        raise DistrecError(f"no file matches {name!r}; check --data")
    matches.sort(key=lambda info: natural_key(_relative(base.path, info.path)))
    return [_input(base.child(info.path).uri, info) for info in matches]


def _path_part(name: str) -> str:
    """The path of a name: all of a local path, the part after ``scheme://authority`` of a URL."""
    if not has_scheme(name):
        return name
    rest = name.split("://", 1)[1]
    return rest[rest.find("/") :] if "/" in rest else ""


def _relative(base: str, path: str) -> str:
    return path[len(base.rstrip("/")) + 1 :]


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def _input(uri: str, info: pafs.FileInfo) -> InputFile:
    mtime = info.mtime_ns
    return InputFile(uri, int(info.size), None if mtime is None else int(mtime))
