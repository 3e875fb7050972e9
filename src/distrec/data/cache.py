"""The cache of parsed inputs: each input file parsed once into its own cache directory, then
memory-mapped by every run.

The layout of a cache directory is in ``distrec.data.cache_files``. A file's cache is named
by a hash of the file's identity (absolute path or URL, size and modification time, format,
schema text), so a changed file gets a new cache and a data set of many files, given a new
file, prepares only that one. A data set of several files is a set directory whose manifest
names its files' caches in file order; a single file's data set is its file's cache, and a
synthetic or MovieLens data set has one cache for all of it.

A cache directory is built under a temporary name and renamed into place when complete
(``distrec.data.preparation``), so a directory under its final name is always whole and is
read without a lock; building takes an exclusive lock per cache, and first removes
temporaries left by a prepare that was killed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath

from distrec.config import DataConfig
from distrec.data.cache_files import CACHE_FORMAT_VERSION, MANIFEST, PARTS, SKIPPED_FILE, read_manifest
from distrec.data.inputs import InputFile, describe_paths, input_files, movielens_directory
from distrec.data.preparation import build
from distrec.data.source import MalformedRows, existing_path
from distrec.data.synthetic import dataset_params
from distrec.errors import DistrecError
from distrec.io import atomic_directory, atomic_write_json

log = logging.getLogger(__name__)


def default_cache_root(cfg: DataConfig) -> Path:
    """``cfg.cache_dir``, else ``$DISTREC_CACHE``, else ``~/.cache/distrec``."""
    root = cfg.cache_dir or os.environ.get("DISTREC_CACHE") or Path.home() / ".cache" / "distrec"
    return Path(root).expanduser()


def cache_names(cfg: DataConfig) -> tuple[list[InputFile | None], list[str]]:
    """The inputs of ``cfg`` (None stands for a whole synthetic or MovieLens data set) and the
    name of each one's cache directory: a readable prefix and a hash of its identity."""
    files = input_files(cfg)
    base = {"version": CACHE_FORMAT_VERSION, "format": cfg.format}
    if cfg.format == "synthetic":
        return [None], [_name(cfg, f"{cfg.synthetic.rows}rows", base | {"synthetic": dataset_params(cfg.synthetic)})]
    if cfg.format == "movielens":
        return [None], [_name(cfg, Path(movielens_directory(cfg)).name, base | {"files": [_identity(f) for f in files]})]
    if cfg.format in ("csv", "parquet"):
        base["schema"] = existing_path(cfg.schema, what="schema").read_text(errors="replace")
    return list(files), [_name(cfg, f.name, base | {"files": [_identity(f)]}) for f in files]


def _identity(file: InputFile) -> list:
    return [file.uri, file.size, file.mtime_ns]


def _name(cfg: DataConfig, stem: str, identity: dict) -> str:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{cfg.format}-{re.sub(r'[^A-Za-z0-9._-]', '_', stem)[:40]}-{digest}"


def prepare(cfg: DataConfig, cache_root: str | Path | None = None, progress: bool = True) -> Path:
    """Parse ``cfg``'s input into the cache (or reuse what is there) and return its directory:
    the file's cache for one file, a set directory for several.

    Only the files without a complete cache are parsed, in parallel (``cfg.prepare_workers``).
    Complete caches are read without locking or writing anything, so a read-only cache
    directory works once it holds them.

    Args:
        cfg: the data section (format, path, schema, strict, chunk_rows, prepare_workers, synthetic).
        cache_root: where caches live (default :func:`default_cache_root`).
        progress: show one progress bar for all files, in bytes/s and rows/s (only on a terminal).

    Raises:
        DistrecError: a missing input or schema, a malformed row with ``cfg.strict``, a file
            without valid rows or that cannot be read, files whose columns differ, a cache
            directory that cannot be written, or a full disk. The files before the first
            failing one keep their caches.
    """
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root(cfg)
    inputs, names = cache_names(cfg)
    targets = [root / name for name in names]
    missing = [i for i, target in enumerate(targets) if not _reuse(target, cfg.strict)]
    if missing:
        with _locked([targets[i] for i in missing], cfg):
            missing = [i for i in missing if not _reuse(targets[i], cfg.strict)]  # others may have prepared some meanwhile
            for i in missing:
                if (targets[i] / MANIFEST).is_file() and _lacks_skipped_record(targets[i], read_manifest(targets[i])):
                    log.warning(f"the cache {targets[i].name} does not record where its skipped rows are (an older distrec made it); preparing it again")
            if missing:
                build(cfg, [inputs[i] for i in missing], [targets[i] for i in missing], progress)
    return targets[0] if len(targets) == 1 else _set(root, cfg, inputs, targets)


def _reuse(target: Path, strict: bool) -> bool:
    """Whether ``target`` is a complete cache of this format (its skipped rows reported again).

    A directory under its final name is always whole (it is renamed into place when
    complete), so no lock is needed to read it. A cache that skipped rows without recording
    where they are (:data:`SKIPPED_FILE`, written since distrec numbers scores by input
    position) is prepared again, under the same name; one that skipped none needs no record.
    """
    if not (target / MANIFEST).is_file():
        return False
    manifest = read_manifest(target)
    if manifest.get("format_version") != CACHE_FORMAT_VERSION:
        return False
    if _lacks_skipped_record(target, manifest):
        return False
    malformed = MalformedRows.from_manifest(manifest, strict)
    # strict mode over a cache made in lenient mode fails as parsing would have
    malformed.raise_if_strict()
    if malformed.count:
        log.warning(f"{malformed.summary()} (when the cache {target.name} was prepared)")
    return True


def _lacks_skipped_record(target: Path, manifest: dict) -> bool:
    """Whether the cache ``target`` skipped rows but has no :data:`SKIPPED_FILE` saying where."""
    return bool(manifest.get("malformed_rows")) and not (target / SKIPPED_FILE).is_file()


@contextmanager
def _locked(targets: list[Path], cfg: DataConfig) -> Iterator[None]:
    """Exclusive advisory locks of the caches ``targets``, taken in name order (so that two
    processes preparing overlapping sets cannot wait for each other), so concurrent processes
    prepare each cache only once."""
    with ExitStack() as stack:
        for target in sorted(targets):
            path = target.parent / f".{target.name}.lock"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                f = stack.enter_context(open(path, "w"))
            except OSError as e:
                if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise
                raise DistrecError(
                    f"cache directory {path.parent} is not writable ({e.strerror}) and holds no complete cache of "
                    f"{describe_paths(cfg.path) if cfg.path is not None else cfg.format}; pass a writable --cache-dir (or set DISTREC_CACHE)"
                ) from None
            fcntl.flock(f, fcntl.LOCK_EX)
            stack.callback(fcntl.flock, f, fcntl.LOCK_UN)
        yield


def _set(root: Path, cfg: DataConfig, files: list[InputFile | None], targets: list[Path]) -> Path:
    """The set directory of several files' caches (made when missing): its manifest names the
    parts in file order and sums their rows, values and skipped rows.

    Raises DistrecError when a file's label, dense or categorical columns differ from the first's.
    """
    digest = hashlib.sha256(json.dumps([t.name for t in targets]).encode()).hexdigest()[:16]
    stem = PurePosixPath(files[0].uri).parent.name or files[0].name
    target = root / f"{cfg.format}-{re.sub(r'[^A-Za-z0-9._-]', '_', stem)[:40]}-{len(targets)}files-{digest}"
    if (target / MANIFEST).is_file():
        return target
    manifests = [read_manifest(t) for t in targets]
    first = manifests[0]
    for file, manifest in zip(files, manifests):
        columns = [(m["label"], m["dense"], [(f["name"], f["multi_hot"]) for f in m["features"]]) for m in (first, manifest)]
        if columns[0] != columns[1]:
            raise DistrecError(
                f"{file.uri} has other columns than {files[0].uri} (label, dense and categorical columns, and which hold several values); "
                "the files of a data set must share one layout"
            )
    manifest = {
        "format_version": CACHE_FORMAT_VERSION,
        PARTS: [t.name for t in targets],
        "files": [f.uri for f in files],
        "rows": sum(m["rows"] for m in manifests),
        "part_rows": [m["rows"] for m in manifests],
        "label": first["label"],
        "dense": first["dense"],
        "features": [f | {"nnz": sum(m["features"][i]["nnz"] for m in manifests)} for i, f in enumerate(first["features"])],
        "malformed_rows": sum(m["malformed_rows"] for m in manifests),
    }
    with _locked([target], cfg):
        if not (target / MANIFEST).is_file():
            with atomic_directory(target) as tmp:
                atomic_write_json(tmp / MANIFEST, manifest)
    return target
