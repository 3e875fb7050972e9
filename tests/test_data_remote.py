"""Inputs read through a filesystem layer: ``file://`` URLs (pyarrow's own) and an in-memory
fsspec filesystem standing for a store pyarrow has no filesystem for; the cache stays local."""

import sys
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distrec.config import DataConfig
from distrec.data import Dataset, list_inputs, prepare, read_manifest
from distrec.data.fingerprint import fingerprint
from distrec.errors import DistrecError

fsspec = pytest.importorskip("fsspec")


def criteo_text(rows, seed) -> bytes:
    rng = np.random.default_rng(seed)
    return "".join(
        "\t".join([str(rng.integers(0, 2)), *map(str, rng.integers(0, 99, 13)), *(f"{h:08x}" for h in rng.integers(0, 1 << 32, 26))]) + "\n"
        for _ in range(rows)
    ).encode()


@pytest.fixture
def memory_days():
    """Criteo days 0-2 (100, 150, 50 rows) in a fresh folder of fsspec's in-memory filesystem; its URL and the files' bytes."""
    fs = fsspec.filesystem("memory")
    root = f"/bucket-{uuid.uuid4().hex[:8]}/criteo"
    texts = [criteo_text(n, seed) for seed, n in enumerate([100, 150, 50])]
    for day, text in enumerate(texts):
        fs.pipe(f"{root}/day_{day}.tsv", text)
    yield f"memory://{root.lstrip('/')}", texts
    fs.rm(root.split("/criteo")[0], recursive=True)


def same_rows(a: Dataset, b: Dataset) -> bool:
    rows = np.arange(a.num_rows)
    x, y = a.batch(rows), b.batch(rows)
    return a.num_rows == b.num_rows and all(getattr(x, n).equal(getattr(y, n)) for n in ("dense", "sparse_values", "sparse_offsets", "labels"))


@pytest.mark.parametrize("workers", [1, 2])
def test_an_in_memory_fsspec_folder_reads_as_the_same_files_on_disk(tmp_path, memory_days, workers):
    url, texts = memory_days
    for day, text in enumerate(texts):
        (tmp_path / f"day_{day}.tsv").write_bytes(text)
    local = Dataset(prepare(DataConfig(path=str(tmp_path), format="criteo"), tmp_path / "c1", progress=False))
    assert [f.uri for f in list_inputs(url)] == [f"{url}/day_{d}.tsv" for d in range(3)]
    cache = prepare(DataConfig(path=url, format="criteo", prepare_workers=workers), tmp_path / "c2", progress=False)
    assert same_rows(local, Dataset(cache))
    assert read_manifest(cache)["files"][1] == f"{url}/day_1.tsv" and cache.parent == tmp_path / "c2"  # the cache is local
    assert [f.uri for f in list_inputs(f"{url}/day_[02].tsv")] == [f"{url}/day_0.tsv", f"{url}/day_2.tsv"]


def test_in_memory_parquet_and_a_missing_remote_file(tmp_path, memory_days):
    url, _ = memory_days
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: click\ndense: [price]\ncategorical: [user]\n")
    with fsspec.open(f"{url}/clicks.parquet", "wb") as f:
        pq.write_table(pa.table({"click": [0, 1, 1], "price": [1.0, 2.0, 3.0], "user": ["a", "b", "a"]}), f)
    cfg = DataConfig(path=f"{url}/clicks.parquet", format="parquet", schema=str(schema))
    dataset = Dataset(prepare(cfg, tmp_path / "cache", progress=False), cfg)
    assert dataset.batch(np.arange(3)).dense[:, 0].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(DistrecError, match=r"data file 'memory://.*/day_9\.tsv' not found; check --data"):
        prepare(DataConfig(path=[f"{url}/day_0.tsv", f"{url}/day_9.tsv"], format="criteo"), tmp_path / "cache", progress=False)


def test_a_file_url_is_the_local_file(tmp_path):
    folder = tmp_path / "criteo"
    folder.mkdir()
    (folder / "day_0.tsv").write_bytes(criteo_text(30, 0))
    local = prepare(DataConfig(path=str(folder / "day_0.tsv"), format="criteo"), tmp_path / "cache", progress=False)
    assert prepare(DataConfig(path=f"file://{folder}/day_0.tsv", format="criteo"), tmp_path / "cache", progress=False) == local
    assert [f.uri for f in list_inputs(f"file://{folder}")] == [str(folder / "day_0.tsv")]


def test_a_scheme_only_fsspec_knows_needs_fsspec(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if it were not installed
    with pytest.raises(DistrecError, match=r"memory:// paths are read through fsspec, which is not installed; pip install 'distrec\[remote\]'"):
        list_inputs("memory://bucket/criteo")


def test_a_remote_files_fingerprint_follows_its_content(memory_days):
    url, texts = memory_days
    cfg = DataConfig(path=url, format="criteo")
    before = fingerprint(cfg)
    assert [f["path"] for f in before["files"]] == [f"{url}/day_{d}.tsv" for d in range(3)]
    changed = bytearray(texts[1])
    changed[10] = ord("9") if changed[10] != ord("9") else ord("8")
    fsspec.filesystem("memory").pipe(url.removeprefix("memory://") + "/day_1.tsv", bytes(changed))
    after = fingerprint(cfg)
    assert before["files"][0] == after["files"][0] and before["files"][1]["sampled_sha256"] != after["files"][1]["sampled_sha256"]


@pytest.mark.parametrize(
    "url, root, inner",
    [
        ("s3://bucket/criteo/day_0.gz", "bucket", "bucket/criteo/day_0.gz"),
        ("gs://bucket/criteo/", "bucket", "bucket/criteo"),
        ("hdfs://namenode:8020/data/day_0", "/", "/data/day_0"),
    ],
)
def test_a_native_store_url_is_read_by_pyarrows_filesystem_at_its_inner_path(monkeypatch, url, root, inner):
    from pyarrow import fs

    from distrec.data import filesystems

    store = fs._MockFileSystem()
    asked = []
    monkeypatch.setattr(filesystems, "_native", lambda base: asked.append(base) or (store, root))  # what from_uri gives the store's root
    location = filesystems.locate(url)
    assert location.filesystem is store and location.path == inner and location.uri == url
    assert asked == [url[: url.index("/", url.index("//") + 2)]]
