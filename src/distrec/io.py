"""Atomic file writes: write to a temporary name beside the target, then rename.

Temporary names are ``.NAME.<random>.tmp`` (and ``.NAME.writing`` for a directory several
processes fill, see :func:`staging_directory`) beside the target ``NAME``. A writer killed
with SIGKILL leaves one behind; :func:`remove_leftovers` clears them, and
:func:`atomic_directory` does so before it starts, so the next write of the same target
cleans up after the killed one.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    """This process's umask (read by setting it and setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _permissions_as_created(path: str | Path, directory: bool = False) -> None:
    """Give a temporary file (0600) or directory (0700) the mode a plain ``open`` or ``mkdir``
    would have: 0666 or 0777 less the umask, so shared run directories stay shared."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _permissions_as_created(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for a file too large to build in memory.

    Write the file at the yielded path inside the block; it is renamed to ``path`` when
    the block ends, or removed if the block raises.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    _permissions_as_created(tmp)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: str | Path, what: str, missing_fix: str, invalid_fix: str) -> object:
    """The JSON document at ``path``; DistrecError naming ``what`` it should be and the fix.

    Example:
        >>> read_json("plan.json", "sharding plan", "check the --plan path", "regenerate it with 'distrec plan'")
    """
    from distrec.errors import DistrecError

    p = Path(path)
    if not p.is_file():
        raise DistrecError(f"{what} {str(p)!r} not found; {missing_fix}")
    try:
        return json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DistrecError(f"{what} {str(p)!r} is not valid JSON ({e}); {invalid_fix}") from None


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: object) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def staging_directory(path: str | Path) -> Path:
    """The fixed temporary name ``.NAME.writing`` beside ``path`` for a directory that
    several processes fill before one of them publishes it (:func:`publish_directory`)."""
    path = Path(path)
    return path.with_name(f".{path.name}.writing")


def leftovers(path: str | Path) -> list[Path]:
    """Temporary files and directories of writes of ``path`` that never finished (sorted)."""
    path = Path(path)
    pattern = str(path.with_name(f".{glob.escape(path.name)}.*.tmp"))
    found = [Path(p) for p in glob.glob(pattern)]
    staging = staging_directory(path)
    return sorted(found + ([staging] if staging.exists() else []))


def remove_leftovers(path: str | Path) -> list[Path]:
    """Remove what :func:`leftovers` finds and return it.

    Call it only when no other process is writing ``path`` (under the writer's lock, or
    in the run's single writer before it starts): a live writer's temporary looks the same.
    """
    removed = leftovers(path)
    for p in removed:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return removed


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it to ``path`` when the block ends.

    An existing ``path`` is replaced only after the new one is complete; if the block
    raises, the temporary directory is removed and ``path`` is left as it was. Temporaries
    of earlier writes of ``path`` that were killed are removed first, so only one writer
    of ``path`` may run at a time (the caller locks, or owns the run directory).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    _permissions_as_created(tmp, directory=True)
    try:
        yield tmp
        publish_directory(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_directory(complete: Path, path: Path) -> None:
    """Rename the finished directory ``complete`` to ``path``, replacing an existing one.

    The old ``path`` is first renamed to ``.NAME.old`` beside it and removed only after the
    new one is in place, so at every instant one complete directory can be found.
    """
    old = path.with_name(f".{path.name}.old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(complete, path)
    shutil.rmtree(old, ignore_errors=True)  # also one left by an earlier interrupted swap
