"""Reading input files wherever they are: local paths, ``file://`` URLs and remote stores.

A path with a scheme (``s3://``, ``gs://``, ``hdfs://``, ``abfs://``, ``file://``) is read
through pyarrow's own filesystem for it (``pyarrow.fs.FileSystem.from_uri``); a scheme
pyarrow does not know (``memory://``, ``http://``, ``az://``, ...) through fsspec, the
optional extra ``pip install 'distrec[remote]'``, wrapped as a pyarrow filesystem. Anything
else is a local path. Credentials and endpoints come from each library's usual environment
(``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``, ...). Only inputs are read this way: the
prepared cache is always on a local disk, because training memory-maps it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from distrec.data.source import describe_error
from distrec.errors import DistrecError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class Location:
    """Where one file or directory is: its filesystem and the path inside it.

    Attributes:
        uri: the name distrec reports and records: an absolute local path, or the URL.
        filesystem: the pyarrow filesystem that reads it.
        path: the path inside ``filesystem``.
    """

    uri: str
    filesystem: pafs.FileSystem
    path: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    def child(self, path: str) -> Location:
        """The location of ``path`` (a path inside the same filesystem, e.g. from a listing)."""
        if self.is_local:
            return Location(path, self.filesystem, path)
        return Location(_join_uri(self.uri, self.path, path), self.filesystem, path)


def has_scheme(name: str) -> bool:
    """Whether ``name`` is a URL (``scheme://...``) rather than a local path."""
    return _SCHEME.match(name) is not None


def locate(name: str | Path) -> Location:
    """The location of a local path (made absolute) or a URL.

    Raises DistrecError when the scheme needs fsspec and it is not installed, or when the
    store cannot be reached (no network, no credentials).
    """
    name = str(name)
    match = _SCHEME.match(name)
    if match is None:
        path = str(Path(name).expanduser().resolve())
        return Location(path, _local(), path)
    parts = urlsplit(name)
    native = _native(f"{parts.scheme}://{parts.netloc}")
    if native is None:
        return _fsspec_location(name, parts.scheme)
    filesystem, root = native
    if isinstance(filesystem, pafs.LocalFileSystem):  # file:///abs/path is a local path, named as such
        path = str(Path(parts.path).resolve())
        return Location(path, filesystem, path)
    # object stores take bucket/key (their root is the bucket), HDFS the plain path (its root is /)
    bucket = root.strip("/")
    return Location(name, filesystem, f"{bucket}/{parts.path.lstrip('/')}".rstrip("/") if bucket else parts.path or "/")


def file_info(location: Location) -> pafs.FileInfo:
    """What is at ``location`` (type NotFound when nothing); DistrecError when the store fails."""
    try:
        return location.filesystem.get_file_info(location.path)
    except (OSError, pa.ArrowException) as e:
        raise DistrecError(f"cannot read {location.uri}: {describe_error(e)}; check the path and the store's credentials") from None


def list_files(directory: Location, recursive: bool = True) -> list[pafs.FileInfo]:
    """The files under ``directory`` (not the directories), in no particular order."""
    try:
        infos = directory.filesystem.get_file_info(pafs.FileSelector(directory.path, recursive=recursive))
    except (OSError, pa.ArrowException) as e:
        raise DistrecError(f"cannot list {directory.uri}: {describe_error(e)}; check the path and the store's credentials") from None
    return [info for info in infos if info.type == pafs.FileType.File]


def open_random_access(location: Location) -> pa.NativeFile:
    """``location`` opened for reads at any offset (``read_at``, ``seek``)."""
    try:
        return location.filesystem.open_input_file(location.path)
    except (OSError, pa.ArrowException) as e:
        raise DistrecError(f"cannot open {location.uri}: {describe_error(e)}; check --data") from None


@functools.cache
def _local() -> pafs.LocalFileSystem:
    return pafs.LocalFileSystem()


@functools.cache
def _native(root: str) -> tuple[pafs.FileSystem, str] | None:
    """pyarrow's filesystem for ``scheme://authority`` and the path it gives that root, or None
    when pyarrow has none for the scheme; made once per process (an S3 one looks up its region)."""
    try:
        return pafs.FileSystem.from_uri(root + "/")
    except pa.ArrowInvalid as e:
        if "Unrecognized filesystem type" in str(e):
            return None
        raise DistrecError(f"cannot read {root}: {describe_error(e)}; check the URL") from None
    except (OSError, pa.ArrowException) as e:
        raise DistrecError(f"cannot reach {root}: {describe_error(e)}; check the URL, the network and the store's credentials") from None


def _fsspec_location(name: str, scheme: str) -> Location:
    """The location of a URL whose scheme only fsspec knows, its filesystem wrapped for pyarrow."""
    try:
        import fsspec
    except ImportError:
        raise DistrecError(f"{scheme}:// paths are read through fsspec, which is not installed; pip install 'distrec[remote]'") from None
    try:
        filesystem, path = fsspec.core.url_to_fs(name)
    except (ImportError, ValueError) as e:
        raise DistrecError(f"cannot read {scheme}:// paths: {describe_error(e)}; install the fsspec backend it names") from None
    return Location(name, pafs.PyFileSystem(pafs.FSSpecHandler(filesystem)), path)


def _join_uri(uri: str, inner: str, other: str) -> str:
    """The URL of ``other``, a path inside the filesystem of ``uri`` below ``inner`` (the path of ``uri``)."""
    inner, other = inner.rstrip("/"), other.rstrip("/")
    if not other.startswith(inner + "/"):
        raise ValueError(f"{other} is not below {inner}")
    return uri.rstrip("/") + other[len(inner) :]
