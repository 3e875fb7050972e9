"""Checkpoints: a directory written under a temporary name and renamed when complete.

A run killed while saving leaves the previous checkpoint usable: the new one only replaces
it by a rename once every file is written (see ``distrec.io.atomic_directory``); a save that
fails (a full disk) removes its staging directory and leaves the previous one in place.

Loading never runs code: state files hold tensors, numbers, strings, lists and dicts only
and are read with ``torch.load(weights_only=True)``; ``meta.json`` keeps each file's
SHA-256, checked before the file is read, so a truncated or overwritten file is named
instead of loaded, and the SHA-256 of its own other entries (``meta_checksum``; checked when
present: checkpoints written before it have none). A file that had settled when it was saved (Hotline's base rows, tens of
GB) also has its identity recorded and is not read again while it keeps it
(``_settled_identities``). Checkpoints of format 2 (before both) pickled NumPy's RNG state:
they load only inside ``trusting_pickles()`` (``--trust-checkpoint``), after a warning line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import pickle
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distrec.errors import DistrecError
from distrec.io import atomic_directory, publish_directory

CHECKPOINT_DIR = "checkpoint"
BEST_DIR = "best"
"""The run directory's folder holding the model of the lowest validation logloss (a checkpoint too)."""
META_FILE = "meta.json"
FORMAT_VERSION = 3
PICKLED_FORMAT_VERSION = 2  # loads only with trusting_pickles()
CHECKSUMS = "sha256"  # meta.json key: file name -> SHA-256 hex digest of that file
IDENTITIES = "file_identity"  # meta.json key: file name -> [device, inode, bytes, mtime ns] of a settled file
META_CHECKSUM = "meta_checksum"  # meta.json key: SHA-256 of meta.json's other entries (``meta_checksum``)
SETTLED_NS = 2_000_000_000
"""A file last modified this long (ns) before its identity is recorded has settled: a later
write gets a later mtime, even on file systems whose clock ticks coarsely."""
TRUST_FLAG = "--trust-checkpoint"
RESTART_FIX = "resume from an earlier checkpoint (a copy of the run directory) or retrain"

_unpickled: set[Path] | None = None  # inside trusting_pickles(): the files unpickled (and warned about) so far


def state_file(rank: int = 0) -> str:
    """File name of one rank's tensors inside a checkpoint directory."""
    return f"state-rank{rank}.pt"


@contextmanager
def trusting_pickles() -> Iterator[None]:
    """Inside the block, a state file that ``weights_only`` loading rejects (a format-2
    checkpoint) is unpickled after a warning line: only for checkpoints from a trusted source."""
    global _unpickled
    before, _unpickled = _unpickled, set()
    try:
        yield
    finally:
        _unpickled = before


def file_checksum(path: Path) -> str:
    """SHA-256 hex digest of a file's bytes (read in 4 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _checksums(directory: Path) -> dict[str, str]:
    """SHA-256 of every file in a checkpoint directory being built. A file hard-linked from
    a checkpoint beside it (Hotline's base rows, maybe larger than RAM) takes the checksum
    that checkpoint's metadata recorded for it instead of being read again."""
    return {f.name: _linked_checksum(f) or file_checksum(f) for f in sorted(directory.iterdir()) if f.is_file()}


def _linked_checksum(path: Path) -> str | None:
    if path.stat().st_nlink < 2:
        return None
    for other in sorted(path.parent.parent.glob(f"*/{path.name}")):
        try:
            if other.parent == path.parent or not other.samefile(path):
                continue
            digest = json.loads((other.parent / META_FILE).read_bytes()).get(CHECKSUMS, {}).get(path.name)
        except (OSError, ValueError, AttributeError):  # removed meanwhile, or not a checkpoint
            continue
        if isinstance(digest, str):
            return digest
    return None


def _tensor_bytes(state: Any) -> int:
    """Bytes of the tensor storages in a (nested) state, each storage counted once."""
    seen: dict[int, int] = {}
    stack = [state]
    while stack:
        item = stack.pop()
        if torch.is_tensor(item):
            storage = item.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return sum(seen.values())


def _directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


@contextmanager
def _disk_full_as_error(target: Path, staging: Path, needed_bytes: int) -> Iterator[None]:
    """Turn a write that fails for lack of space into a DistrecError naming ``target`` and the
    space needed, after removing ``staging`` (a directory or file); other failures also
    remove it and propagate.

    torch.save reports a full disk as a RuntimeError ("unexpected pos"), so a RuntimeError
    counts as a full disk when ``needed_bytes`` do not fit in the free space plus what the
    partial files take (freed once they are removed and the failed writer is gone).
    """
    try:
        yield
    except (OSError, RuntimeError) as e:
        free = shutil.disk_usage(target.parent).free + (_directory_bytes(staging) if staging.is_dir() else staging.stat().st_size if staging.exists() else 0)
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        staging.unlink(missing_ok=True)
        if getattr(e, "errno", None) == errno.ENOSPC or (isinstance(e, RuntimeError) and free < needed_bytes):
            kept = " (the previous checkpoint is intact)" if (target / META_FILE).is_file() else ""
            raise DistrecError(
                f"no space left to save the checkpoint {str(target)!r}: it needs about {needed_bytes / 2**20:,.2f} MiB "
                f"and {free / 2**20:,.2f} MiB are free; free some space or pass another --out{kept}"
            ) from None
        raise


def _identity(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _settled_identities(directory: Path, names: list[str]) -> dict[str, list[int]]:
    """The identity of each named file that has not changed for SETTLED_NS: a check finding
    the same identity later takes the file as the bytes its checksum was taken of (the way
    git's index skips unchanged files), so a large file is read once, not at every load."""
    now = time.time_ns()
    identities = {name: _identity(directory / name) for name in names}
    return {name: identity for name, identity in identities.items() if now - identity[3] > SETTLED_NS}


def meta_checksum(meta: dict[str, Any]) -> str:
    """SHA-256 hex digest of the entries of ``meta`` but ``META_CHECKSUM``, as canonical JSON
    (keys sorted, no spaces): the same for any indentation or key order of the file."""
    rest = {key: value for key, value in meta.items() if key != META_CHECKSUM}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _write_meta(directory: Path, meta: dict[str, Any], checksums: dict[str, str]) -> None:
    identities = _settled_identities(directory, sorted(checksums))
    content = {"format_version": FORMAT_VERSION, **meta, CHECKSUMS: checksums, IDENTITIES: identities}
    (directory / META_FILE).write_text(json.dumps({**content, META_CHECKSUM: meta_checksum(content)}, indent=2))


def save_checkpoint(
    run_dir: Path,
    states: dict[int, dict[str, Any]],
    meta: dict[str, Any],
    write_files: Callable[[Path], None] | None = None,
    name: str = CHECKPOINT_DIR,
    files_bytes: int = 0,
) -> Path:
    """Write ``states`` (rank -> state dict of tensors) and ``meta`` (JSON) as run_dir/``name``.

    ``write_files(directory)``, when given, adds files too large for a state dict (Hotline's
    tables, at most ``files_bytes``) to the checkpoint directory while it is being built.
    Raises DistrecError when the disk is full (the previous checkpoint stays, the partial one
    is removed).
    """
    target = Path(run_dir) / name
    needed = max(sum(_tensor_bytes(state) for state in states.values()) + files_bytes, _directory_bytes(target))  # the last one's size, with its file overheads
    with atomic_directory(target) as tmp, _disk_full_as_error(target, tmp, needed):
        for rank, state in states.items():
            torch.save(state, tmp / state_file(rank))
        if write_files is not None:
            write_files(tmp)
        _write_meta(tmp, meta, _checksums(tmp))
    return target


def save_checkpoint_collectively(
    run_dir: Path, state: dict[str, Any], meta: dict[str, Any], group: dist.ProcessGroup | None = None, name: str = CHECKPOINT_DIR
) -> Path:
    """Every rank of ``group`` writes its ``state`` into run_dir/``name``; rank 0 adds ``meta``.

    A collective call. The files go into a staging directory that rank 0 renames into place
    only after every rank has written, so a run killed during the save (any rank) leaves the
    previous checkpoint complete; a staging directory left behind is cleared at the next save.
    A full disk on any rank is a DistrecError on every rank, the staging directory removed.
    """
    rank = dist.get_rank(group)
    target = Path(run_dir) / name
    staging = target.with_name(f".{name}.writing")
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    dist.barrier(group)
    name, checksum, error = state_file(rank), None, None
    try:
        with _disk_full_as_error(target, staging / name, _tensor_bytes(state)):
            torch.save(state, staging / name)
        checksum = file_checksum(staging / name)
    except DistrecError as e:
        error = str(e)
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, (name, checksum, error), group=group)
    errors = [e for _, _, e in every if e is not None]
    if errors:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        raise DistrecError(errors[0])
    if rank == 0:
        _write_meta(staging, meta, {n: c for n, c, _ in every})
        publish_directory(staging, target)
    dist.barrier(group)
    return target


def find_checkpoint(path: Path, best: bool = False) -> Path:
    """The checkpoint directory for ``path``: a run directory (its ``best/`` model first when
    ``best``, else its last ``checkpoint/``) or a checkpoint folder itself.

    Falls back to the previous checkpoint when a save was interrupted between its two renames.
    """
    path = Path(path)
    for candidate in (path, *([path / BEST_DIR] if best else []), path / CHECKPOINT_DIR, path / f".{CHECKPOINT_DIR}.old", path.parent / f".{path.name}.old"):
        if (candidate / META_FILE).is_file():
            return candidate
    if not path.exists():
        raise DistrecError(f"checkpoint {str(path)!r} not found; pass a run directory written by 'distrec train --out'")
    raise DistrecError(f"{str(path)!r} holds no checkpoint ({CHECKPOINT_DIR}/{META_FILE} missing); train with --out first")


def has_checkpoint(path: Path) -> bool:
    """Whether ``path`` (a run directory or checkpoint folder) holds a readable checkpoint."""
    try:
        find_checkpoint(path)
    except DistrecError:
        return False
    return True


def _meta_json(checkpoint: Path) -> dict[str, Any]:
    """meta.json of a checkpoint directory, parsed, of a format this distrec reads."""
    path = Path(checkpoint) / META_FILE
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise DistrecError(f"checkpoint metadata {str(path)!r} is unreadable ({type(e).__name__}); {RESTART_FIX}") from None
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise DistrecError(f"checkpoint metadata {str(path)!r} holds no format_version; {RESTART_FIX}")
    if META_CHECKSUM in meta and meta[META_CHECKSUM] != meta_checksum(meta):  # absent before distrec wrote it
        raise DistrecError(
            f"checkpoint metadata {str(path)!r} is corrupt (its {META_CHECKSUM} differs from its content); {RESTART_FIX} "
            f"(after an edit on purpose, delete its {META_CHECKSUM} entry)"
        )
    version = meta["format_version"]
    if version not in (FORMAT_VERSION, PICKLED_FORMAT_VERSION):
        raise DistrecError(f"checkpoint {str(checkpoint)!r} has format {version}, this distrec reads {FORMAT_VERSION}; use the matching distrec version")
    if version == FORMAT_VERSION and not isinstance(meta.get(CHECKSUMS), dict):
        raise DistrecError(f"checkpoint metadata {str(path)!r} holds no checksums ({CHECKSUMS}); {RESTART_FIX}")
    if not isinstance(meta.get(IDENTITIES, {}), dict):
        raise DistrecError(f"checkpoint metadata {str(path)!r} has a malformed {IDENTITIES}; delete that entry (the files are then checked by their checksums)")
    return meta


def read_meta(checkpoint: Path) -> dict[str, Any]:
    """The JSON metadata of a checkpoint directory, after checking the checksums of the files
    beside the rank states (Hotline's tables; each state is checked by ``load_state``)."""
    meta = _meta_json(checkpoint)
    for name in meta.get(CHECKSUMS, {}):
        if not name.startswith("state-rank"):
            _verify(Path(checkpoint) / name, meta)
    return meta


def _verify(path: Path, meta: dict[str, Any]) -> None:
    """DistrecError unless ``path`` has the checksum ``meta`` recorded for it (taken as read
    when the file keeps the identity recorded with it: the same file, size and mtime)."""
    expected = meta[CHECKSUMS].get(path.name)
    if not path.is_file():
        problem = "is missing"
    elif expected is None:
        problem = "is not in the checkpoint's checksums"
    elif _identity(path) == meta.get(IDENTITIES, {}).get(path.name) or file_checksum(path) == expected:
        return
    else:
        problem = "is corrupt (its checksum differs from the one saved)"
    raise DistrecError(f"checkpoint file {str(path)!r} {problem}; {RESTART_FIX}")


def load_state(checkpoint: Path, rank: int = 0, map_location: Any = None) -> dict[str, Any]:
    """One rank's state dict from a checkpoint directory (tensors memory-mapped, read on use).

    The file's checksum is checked first; it is read with ``weights_only=True`` (tensors and
    plain containers only), a format-2 file with pickles only inside ``trusting_pickles()``.
    """
    checkpoint = Path(checkpoint)
    f = checkpoint / state_file(rank)
    if not f.is_file():
        raise DistrecError(f"checkpoint {str(checkpoint)!r} has no state for rank {rank}; it is incomplete, resume from an earlier run directory")
    meta = _meta_json(checkpoint)
    if meta["format_version"] == FORMAT_VERSION:
        _verify(f, meta)
    try:
        return torch.load(f, map_location=map_location, weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        if "weights_only" not in str(e) and "Weights only" not in str(e):
            raise DistrecError(f"checkpoint file {str(f)!r} is unreadable ({type(e).__name__}); {RESTART_FIX}") from None
        if _unpickled is None:
            raise DistrecError(
                f"checkpoint file {str(f)!r} holds pickled Python objects, which loading would run as code "
                f"(an older distrec's checkpoint, or a tampered one); add {TRUST_FLAG} only if you trust where it came from"
            ) from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:
        raise DistrecError(f"checkpoint file {str(f)!r} is unreadable ({type(e).__name__}); {RESTART_FIX}") from None
    if f not in _unpickled:
        print(f"distrec: warning: {TRUST_FLAG}: unpickling {str(f)!r}, which runs any code it holds", file=sys.stderr)
        _unpickled.add(f)
    return torch.load(f, map_location=map_location, weights_only=False, mmap=True)
