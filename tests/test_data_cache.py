import json
import os

import numpy as np
import pytest

import distrec.data.cache as cache
import distrec.data.cache_files as cache_files
import distrec.data.preparation as preparation
from distrec.config import DataConfig, SyntheticConfig
from distrec.data import Dataset, SyntheticGenerator, prepare, read_manifest, read_synthetic
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

    def no_parsing(cfg, *args, **kwargs):
        raise AssertionError("the complete cache should have been reused")

    monkeypatch.setattr(preparation, "open_source", no_parsing)
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
    def failing_source(cfg, *args, **kwargs):
        def chunks():
            yield Chunk(np.zeros((2, 1), np.float32), np.zeros(2, np.float32), [(np.ones(2, np.int64), np.ones(2, np.int32))])
            raise RuntimeError("disk on fire")

        return Source({"format": "criteo"}, "label", ["x"], [SparseFeature("c")], chunks(), MalformedRows("x"))

    monkeypatch.setattr(preparation, "open_source", failing_source)
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


@pytest.mark.parametrize(
    "cfg, message",
    [
        (DataConfig(path="/no/such/file.tsv", format="criteo"), "not found; check --data"),
        (DataConfig(path="/no/such/dir", format="movielens"), "not found; check --data"),
        (DataConfig(path=None, format="criteo"), "needs --data"),
        (DataConfig(path="x.csv", format="csv"), "needs --schema"),
        (DataConfig(path="x.tsv", format="synthetic"), "drop --data"),
    ],
)
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


def _refusing_writes(err: int, after_bytes: int = 0):
    """An ``open`` for distrec.data.cache whose files refuse writes beyond ``after_bytes`` in all with errno ``err``."""
    import builtins

    written = [0]

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            size = memoryview(data).nbytes
            if written[0] + size > after_bytes:
                raise OSError(err, os.strerror(err))
            written[0] += size
            return self.f.write(data)

        def fileno(self):
            return self.f.fileno()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fake_open(file, mode="r", *args, **kwargs):
        if not any(c in mode for c in "wax+"):
            return builtins.open(file, mode, *args, **kwargs)
        if after_bytes == 0:
            raise OSError(err, os.strerror(err), str(file))
        return Full(builtins.open(file, mode, *args, **kwargs))

    return fake_open


def _disk_full_after(limit: int):
    """A ``cache_files.write_at`` that fails with ENOSPC once ``limit`` bytes are written in all."""
    import errno

    written = [0]
    write_at = cache_files.write_at

    def full(fd, array, offset):
        written[0] += array.nbytes
        if written[0] > limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_at(fd, array, offset)

    return full


def test_read_only_cache_dir_holding_the_cache_is_read_without_a_lock(tmp_path, monkeypatch, caplog):
    # regression: a read-only --cache-dir failed on the lock file (Errno 30) although the cache was complete
    import errno

    data = write_criteo(tmp_path / "d.tsv", [criteo_line(), criteo_line(label="x"), criteo_line()])
    cfg = DataConfig(path=str(data), format="criteo")
    root = tmp_path / "cache"
    path = prepare(cfg, root, progress=False)
    (root / f".{path.name}.lock").unlink()
    monkeypatch.setattr(cache, "open", _refusing_writes(errno.EROFS), raising=False)
    with caplog.at_level("WARNING", logger="distrec.data.cache"):
        assert prepare(cfg, root, progress=False) == path
    assert Dataset(path, cfg).num_rows == 2
    # regression: the skipped rows are reported again when the cache is reused
    assert "skipped 1 malformed row(s); first at line 2" in caplog.text
    other = write_criteo(tmp_path / "e.tsv", [criteo_line()])
    with pytest.raises(
        DistrecError,
        match=r"cache directory .*cache is not writable \(Read-only file system\) and holds "
        r"no complete cache of .*e\.tsv; pass a writable --cache-dir",
    ):
        prepare(DataConfig(path=str(other), format="criteo"), root, progress=False)


@pytest.mark.parametrize("chunk_rows", [500, 100_000])
def test_full_disk_names_the_cache_dir_and_the_space_needed(shared_data, tmp_path, monkeypatch, chunk_rows):
    # regression: a full cache disk gave an OSError traceback
    import re

    cfg = DataConfig(path=str(shared_data / "criteo" / "criteo_kaggle_sample.tsv"), format="criteo", chunk_rows=chunk_rows)
    full_size = sum(f.stat().st_size for f in prepare(cfg, tmp_path / "roomy", progress=False).iterdir())
    root = tmp_path / "cache"
    monkeypatch.setattr(cache_files, "write_at", _disk_full_after(300_000))
    with pytest.raises(
        DistrecError,
        match=r"no space left on the disk of .*cache for the cache of .*criteo_kaggle_sample"
        r"\.tsv: it needs about [\d.]+ MB .*pass --cache-dir on a larger disk",
    ) as e:
        prepare(cfg, root, progress=False)
    needed = float(re.search(r"about ([\d.]+) MB", str(e.value)).group(1)) * 1e6
    assert needed == pytest.approx(full_size, rel=0.1)
    assert entries(root) == []


def test_temporaries_of_a_killed_prepare_are_removed_by_the_next(tmp_path):
    # regression: `.tmp` folders left by kill -9 during a prepare were never cleaned
    data = write_criteo(tmp_path / "d.tsv", [criteo_line()] * 3)
    cfg = DataConfig(path=str(data), format="criteo")
    root = tmp_path / "cache"
    name = cache.cache_names(cfg)[1][0]
    killed = root / f".{name}.k1ll3d.tmp"
    killed.mkdir(parents=True)
    (killed / "dense.f32").write_bytes(b"\0" * 100)
    unrelated = root / ".other-cache.abc.tmp"
    unrelated.mkdir()
    path = prepare(cfg, root, progress=False)
    assert entries(root) == [unrelated.name, path.name]


def test_skipped_rows_are_reported_again_when_the_cache_is_reused(tmp_path, caplog):
    # regression: the skipped-row count was printed by the prepare that parsed, never on reuse
    data = write_criteo(tmp_path / "d.tsv", [criteo_line(), criteo_line(label="x")])
    cfg = DataConfig(path=str(data), format="criteo")
    prepare(cfg, tmp_path / "cache", progress=False)
    caplog.clear()
    with caplog.at_level("WARNING", logger="distrec.data.cache"):
        prepare(cfg, tmp_path / "cache", progress=False)
    assert len(caplog.records) == 1 and "skipped 1 malformed row(s); first at line 2" in caplog.records[0].getMessage()


def test_a_cache_without_the_positions_of_its_skipped_rows_is_prepared_again(tmp_path, caplog, monkeypatch):
    """Caches of distrec versions before ``skipped.i64``: one that skipped rows is prepared
    again (its rows' input positions are unknown), one that skipped none is reused as it is."""
    skipping = DataConfig(path=str(write_criteo(tmp_path / "d.tsv", [criteo_line(), criteo_line(label="x"), criteo_line()])), format="criteo")
    clean = DataConfig(path=str(write_criteo(tmp_path / "e.tsv", [criteo_line()] * 3)), format="criteo")
    root = tmp_path / "cache"
    old, old_clean = prepare(skipping, root, progress=False), prepare(clean, root, progress=False)
    assert Dataset(old).input_positions(np.arange(2)).tolist() == [0, 2] and np.fromfile(old / "skipped.i64", np.int64).tolist() == [1]
    (old / "skipped.i64").unlink()
    (old_clean / "skipped.i64").unlink()
    with pytest.raises(DistrecError, match="does not record where its skipped rows are"):
        Dataset(old).input_positions(np.arange(2))
    with caplog.at_level("WARNING", logger="distrec.data.cache"):
        assert prepare(skipping, root, progress=False) == old
    assert "does not record where its skipped rows are (an older distrec made it); preparing it again" in caplog.text
    assert Dataset(old).input_positions(np.arange(2)).tolist() == [0, 2]

    def no_parsing(cfg, *args, **kwargs):
        raise AssertionError("the cache that skipped no row should have been reused")

    monkeypatch.setattr(preparation, "open_source", no_parsing)
    assert prepare(clean, root, progress=False) == old_clean
    assert Dataset(old_clean).input_positions(np.arange(3)).tolist() == [0, 1, 2]


def test_training_epochs_after_the_first_draw_fresh_synthetic_rows(tmp_path):
    syn = SyntheticConfig(rows=1000, table_rows=500, pooling_factor=2, seed=3)
    cfg = DataConfig(format="synthetic", synthetic=syn, max_ind_range=10_000)
    path = prepare(cfg, tmp_path, progress=False)
    dataset = Dataset(path, cfg)
    rows = np.arange(100, 1000)

    def epoch(e, fresh=True, start_step=0, ds=dataset):
        return [
            b.sparse_values.tolist() + b.dense.flatten().tolist()
            for b in ds.batches(rows, 128, shuffle=True, seed=1, epoch=e, start_step=start_step, fresh=fresh)
        ]

    assert epoch(0) == epoch(0, fresh=False)  # the first epoch reads the cached rows
    assert epoch(1) != epoch(1, fresh=False)  # later ones draw new rows
    assert epoch(1) == epoch(1) and epoch(1, start_step=3) == epoch(1)[3:]  # deterministic and resumable
    assert epoch(2) != epoch(1)
    some = np.array([900, 5])
    assert np.array_equal(Dataset(path, cfg).batch(some, draw=1).dense.numpy(), SyntheticGenerator(syn).draw(some, 1).dense)
    cfg.synthetic.fresh_each_epoch = False
    assert prepare(cfg, tmp_path, progress=False) == path  # the same cache: the rows are the same
    assert epoch(1, ds=Dataset(path, cfg)) == epoch(1, fresh=False)
