import json
import os

import numpy as np
import pytest

import distrec.data.cache as cache
from distrec.config import DataConfig, SyntheticConfig
from distrec.data import Dataset, prepare, read_manifest, read_synthetic
from distrec.data.source import Chunk, MalformedRows, Source, SparseFeature
from distrec.errors import DistrecError


def criteo_line(label="0", first_int="1"):
    return "\t".join([label, first_int, *["2"] * 12, *["0000abcd"] * 26])


def write_criteo(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def entries(root):
    """Everything under the cache root except the lock files."""
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))


def test_criteo_sample_cache_layout_and_reuse(shared_data, tmp_path, monkeypatch):
    cfg = DataConfig(path=str(shared_data / "criteo" / "criteo_kaggle_sample.tsv"), format="criteo", chunk_rows=1000)
    path = prepare(cfg, tmp_path, progress=False)
    assert path.parent == tmp_path and path.name.startswith("criteo-criteo_kaggle_sample.tsv-")
    manifest = read_manifest(path)
    assert manifest["rows"] == 4380 and manifest["chunks"] >= 5 and manifest["malformed_rows"] == 0
    assert manifest["dense"] == [f"I{i}" for i in range(1, 14)] and manifest["label"] == "label"
    assert [f["name"] for f in manifest["features"]][:2] == ["C1", "C2"]
    assert all(f["id_bound"] is None and not f["multi_hot"] for f in manifest["features"])
    assert (path / "dense.f32").stat().st_size == 4380 * 13 * 4
    assert (path / "sparse_0.ids.i64").stat().st_size == 4380 * 8
    assert not (path / "sparse_0.offsets.i64").exists()

    def no_parsing(cfg):
        raise AssertionError("the complete cache should have been reused")

    monkeypatch.setattr(cache, "open_source", no_parsing)
    assert prepare(cfg, tmp_path, progress=False) == path
    assert entries(tmp_path) == [path.name]


def test_changed_input_gets_a_new_cache(tmp_path):
    data = write_criteo(tmp_path / "d.tsv", [criteo_line()] * 3)
    root = tmp_path / "cache"
    cfg = DataConfig(path=str(data), format="criteo")
    first = prepare(cfg, root, progress=False)
    write_criteo(data, [criteo_line()] * 4)
    os.utime(data, ns=(1, 1))
    second = prepare(cfg, root, progress=False)
    assert first != second and read_manifest(second)["rows"] == 4


def test_failure_mid_prepare_leaves_no_cache(tmp_path, monkeypatch):
    def failing_source(cfg):
        def chunks():
            yield Chunk(np.zeros((2, 1), np.float32), np.zeros(2, np.float32), [(np.ones(2, np.int64), np.ones(2, np.int32))])
            raise RuntimeError("disk on fire")

        return Source({"format": "criteo"}, "label", ["x"], [SparseFeature("c")], chunks(), MalformedRows("x"))

    monkeypatch.setattr(cache, "open_source", failing_source)
    data = write_criteo(tmp_path / "d.tsv", [criteo_line()])
    root = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="disk on fire"):
        prepare(DataConfig(path=str(data), format="criteo"), root, progress=False)
    assert entries(root) == []


def test_strict_error_mid_file_leaves_no_cache(tmp_path):
    data = write_criteo(tmp_path / "d.tsv", [criteo_line()] * 10 + [criteo_line(first_int="seven")])
    root = tmp_path / "cache"
    with pytest.raises(DistrecError, match=r"d\.tsv: line 11: I1 is not an integer"):
        prepare(DataConfig(path=str(data), format="criteo", strict=True, chunk_rows=3), root, progress=False)
    assert entries(root) == []


def test_lenient_cache_reused_in_strict_mode_still_fails(tmp_path):
    data = write_criteo(tmp_path / "d.tsv", [criteo_line(), criteo_line(label="x"), criteo_line()])
    root = tmp_path / "cache"
    path = prepare(DataConfig(path=str(data), format="criteo"), root, progress=False)
    manifest = read_manifest(path)
    assert manifest["rows"] == 2 and manifest["malformed_rows"] == 1 and manifest["malformed_lines"] == [2]
    with pytest.raises(DistrecError, match="line 2: the label is not an integer"):
        prepare(DataConfig(path=str(data), format="criteo", strict=True), root, progress=False)


@pytest.mark.parametrize("cfg, message", [
    (DataConfig(path="/no/such/file.tsv", format="criteo"), "not found; check --data"),
    (DataConfig(path="/no/such/dir", format="movielens"), "not found; check --data"),
    (DataConfig(path=None, format="criteo"), "needs --data"),
    (DataConfig(path="x.csv", format="csv"), "needs --schema"),
    (DataConfig(path="x.tsv", format="synthetic"), "drop --data"),
])
def test_input_errors(tmp_path, cfg, message):
    with pytest.raises(DistrecError, match=message):
        prepare(cfg, tmp_path, progress=False)


def test_empty_data_is_an_error(tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(DistrecError, match="has no valid rows; check --data"):
        prepare(DataConfig(path=str(empty), format="criteo"), tmp_path / "c", progress=False)
    junk = write_criteo(tmp_path / "junk.tsv", ["a\tb", "c\td"])
    with pytest.raises(DistrecError, match="no valid rows; .*skipped 2 malformed row.*line 1"):
        prepare(DataConfig(path=str(junk), format="criteo"), tmp_path / "c", progress=False)
    assert entries(tmp_path / "c") == []


def test_default_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "env"))
    assert cache.default_cache_root(DataConfig(cache_dir=str(tmp_path / "cfg"))) == tmp_path / "cfg"
    assert cache.default_cache_root(DataConfig()) == tmp_path / "env"
    monkeypatch.delenv("DISTREC_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.default_cache_root(DataConfig()) == tmp_path / "home" / ".cache" / "distrec"


def test_synthetic_cache_matches_the_generator(tmp_path):
    syn = SyntheticConfig(rows=1000, table_rows=500, pooling_factor=2, interaction_groups=2, seed=3)
    cfg = DataConfig(format="synthetic", synthetic=syn, chunk_rows=300, max_ind_range=10_000)
    path = prepare(cfg, tmp_path, progress=False)
    manifest = read_manifest(path)
    assert manifest["rows"] == 1000 and manifest["chunks"] == 4
    assert len(manifest["source"]["interaction_groups"]) == 26
    on_disk = Dataset(path, cfg)
    in_memory = Dataset.from_source(read_synthetic(syn), cfg)
    rows = np.array([999, 0, 500, 7])
    a, b = on_disk.batch(rows), in_memory.batch(rows)
    for name in ("dense", "sparse_values", "sparse_offsets", "labels"):
        assert getattr(a, name).equal(getattr(b, name)), name


def test_movielens_cache_round_trip(shared_data, tmp_path):
    cfg = DataConfig(path=str(shared_data / "movielens"), format="movielens", chunk_rows=20_000)
    dataset = Dataset(prepare(cfg, tmp_path, progress=False), cfg)
    assert dataset.num_rows == 80_000 and dataset.num_dense == 3
    assert [t.num_rows for t in dataset.tables(8)] == [944, 1683, 3, 22, dataset.table_rows["zip_prefix"], 8, 20]
    assert json.loads((next(tmp_path.glob("movielens-*")) / "manifest.json").read_text())["features"][6]["multi_hot"]
    batch = dataset.batch(np.array([0, 1]))
    assert batch.feature_values(0).tolist() == [196, 186]  # user ids of the first two ratings
    assert batch.feature_values(6).tolist()[:1] == [6]  # Kolya: Comedy
