"""Many input files as one data set: listing, per-file caches, parts of files prepared in
parallel, the set a Dataset reads in file order, and holding out whole files."""

import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import distrec.data.preparation as preparation
from distrec.config import DataConfig
from distrec.data import Dataset, list_inputs, prepare, read_manifest
from distrec.data.cache_files import PARTS
from distrec.errors import DistrecError


def criteo_lines(rng, n, first_count=0):
    """``n`` Criteo lines whose first count is its index from ``first_count`` (to find rows again)."""
    lines = []
    for i in range(n):
        ints = [str(first_count + i), *[rng.choice(["", "3", "-1", "250"]) for _ in range(12)]]
        cats = [rng.choice(["", f"{rng.integers(0, 1 << 32):08x}"]) for _ in range(26)]
        lines.append("\t".join([str(rng.integers(0, 2)), *ints, *cats]))
    return lines


def write(path, lines, compress=False):
    text = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


@pytest.fixture
def days(tmp_path):
    """Criteo days 0, 1, 2 and 10 (day 2 compressed) of 300, 200, 250 and 100 rows in criteo/; their lines."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "criteo"
    folder.mkdir()
    lines, start = {}, 0
    for day, n in [(0, 300), (1, 200), (2, 250), (10, 100)]:
        lines[day] = criteo_lines(rng, n, start)
        start += n
        write(folder / (f"day_{day}.gz" if day == 2 else f"day_{day}"), lines[day], compress=day == 2)
    (folder / "_SUCCESS").write_text("")
    return folder, lines


def first_counts(dataset, rows=None):
    """The first count of each row (its index in the data set, as the fixtures write it)."""
    rows = np.arange(dataset.num_rows) if rows is None else rows
    return np.rint(np.expm1(dataset.batch(rows).dense[:, 0].double().numpy())).astype(int).tolist()


def test_a_directory_is_its_files_in_natural_order(days, tmp_path):
    folder, lines = days
    assert [f.name for f in list_inputs(str(folder))] == ["day_0", "day_1", "day_2.gz", "day_10"]
    cfg = DataConfig(path=str(folder), format="criteo")
    cache = prepare(cfg, tmp_path / "cache", progress=False)
    manifest = read_manifest(cache)
    assert manifest["rows"] == 850 and len(manifest[PARTS]) == 4 and manifest["files"][2].endswith("day_2.gz")
    dataset = Dataset(cache, cfg)
    assert dataset.num_rows == 850 and dataset.file_starts.tolist() == [0, 300, 500, 750, 850]
    assert first_counts(dataset) == list(range(850))  # every row, in file order


def test_globs_and_lists_name_files_in_their_order(days, tmp_path):
    folder, _ = days
    assert [f.name for f in list_inputs(str(folder / "day_?"))] == ["day_0", "day_1"]
    assert [f.name for f in list_inputs(str(tmp_path / "*" / "day_1*"))] == ["day_1", "day_10"]
    named = [str(folder / "day_10"), str(folder / "day_0")]
    assert [f.name for f in list_inputs(named)] == ["day_10", "day_0"]
    dataset = Dataset(prepare(DataConfig(path=named, format="criteo"), tmp_path / "cache", progress=False))
    assert first_counts(dataset) == [*range(750, 850), *range(300)]
    with pytest.raises(DistrecError, match="day_0 is named twice in --data"):
        list_inputs([str(folder / "day_0"), str(folder)])
    with pytest.raises(DistrecError, match=r"no file matches .*day_9\*"):
        list_inputs(str(folder / "day_9*"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DistrecError, match="holds no data files"):
        list_inputs(str(tmp_path / "empty"))


def test_a_new_file_prepares_only_itself(days, tmp_path, monkeypatch):
    folder, _ = days
    root = tmp_path / "cache"
    first = prepare(DataConfig(path=str(folder), format="criteo"), root, progress=False)
    write(folder / "day_11", criteo_lines(np.random.default_rng(1), 40, 850))
    opened = []
    open_source = preparation.open_source

    def counting(cfg, file=None, *args, **kwargs):
        opened.append(file.name)
        return open_source(cfg, file, *args, **kwargs)

    monkeypatch.setattr(preparation, "open_source", counting)
    second = prepare(DataConfig(path=str(folder), format="criteo"), root, progress=False)
    assert set(opened) == {"day_11"} and second != first
    assert first_counts(Dataset(second)) == list(range(890))
    assert read_manifest(first)[PARTS] == read_manifest(second)[PARTS][:4]


@pytest.mark.parametrize("workers", [1, 2])
def test_parts_of_a_file_give_the_rows_and_lines_of_the_whole(tmp_path, monkeypatch, workers):
    rng = np.random.default_rng(2)
    lines = criteo_lines(rng, 3000)
    for line_number in (40, 1777, 2999):  # malformed rows in the first, a middle and the last part
        lines[line_number - 1] = "1\t2\t3"
    path = write(tmp_path / "day.tsv", lines)
    whole = Dataset(prepare(DataConfig(path=str(path), format="criteo"), tmp_path / "whole", progress=False))
    monkeypatch.setattr(preparation, "MIN_PART_BYTES", 1)
    cfg = DataConfig(path=str(path), format="criteo", chunk_rows=64, prepare_workers=workers)  # parts of 16 kB, ~50 of them
    assert len(preparation.plan_parts(cfg, list_inputs(cfg.path))) > 30
    cache = prepare(cfg, tmp_path / "parts", progress=False)
    manifest = read_manifest(cache)
    assert manifest["rows"] == 2997 and manifest["malformed_rows"] == 3 and manifest["malformed_lines"] == [40, 1777, 2999]
    parts = Dataset(cache)
    rows = np.random.default_rng(3).permutation(2997)[:500]
    a, b = whole.batch(rows), parts.batch(rows)
    for name in ("dense", "sparse_values", "sparse_offsets", "labels"):
        assert getattr(a, name).equal(getattr(b, name)), name
    assert np.fromfile(cache / "skipped.i64", np.int64).tolist() == [39, 1776, 2998]
    for dataset in (whole, parts):  # each row's first count is its line's index: its input position
        assert dataset.input_positions(rows).tolist() == first_counts(dataset, rows)
    strict = DataConfig(path=str(path), format="criteo", chunk_rows=64, prepare_workers=workers, strict=True)
    with pytest.raises(DistrecError, match=r"day\.tsv: line 40: "):
        prepare(strict, tmp_path / "strict", progress=False)


def test_csv_parts_keep_the_header_and_the_bags(tmp_path, monkeypatch):
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: click\ndense: [price]\ncategorical: [user, {name: tags, separator: '|'}]\n")
    rng = np.random.default_rng(4)
    rows = ["click,price,user,tags"] + [f"{rng.integers(0, 2)},{i}.5,u{rng.integers(0, 50)},{'|'.join(f't{t}' for t in range(i % 4))}" for i in range(2000)]
    path = tmp_path / "clicks.csv"
    path.write_text("\n".join(rows) + "\n")
    whole = Dataset(prepare(DataConfig(path=str(path), format="csv", schema=str(schema)), tmp_path / "whole", progress=False))
    monkeypatch.setattr(preparation, "MIN_PART_BYTES", 1)
    cfg = DataConfig(path=str(path), format="csv", schema=str(schema), chunk_rows=32, prepare_workers=2)
    parts = Dataset(prepare(cfg, tmp_path / "parts", progress=False))
    assert parts.num_rows == whole.num_rows == 2000
    everything = np.arange(2000)
    for name in ("dense", "sparse_values", "sparse_offsets", "labels"):
        assert getattr(whole.batch(everything), name).equal(getattr(parts.batch(everything), name)), name


def test_parquet_parts_with_bags_read_across_files(tmp_path):
    folder = tmp_path / "clicks"
    folder.mkdir()
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: click\ndense: [price]\ncategorical: [user, tags]\n")
    starts = [0, 120, 200]
    for k, (start, end) in enumerate(zip(starts, [*starts[1:], 330])):
        ids = np.arange(start, end)
        table = pa.table({"click": ids % 2, "price": ids.astype(float), "user": [f"u{i}" for i in ids], "tags": [[f"t{i}"] * (i % 3) for i in ids]})
        pq.write_table(table, folder / f"part-{k}.parquet")
    cfg = DataConfig(path=str(folder), format="parquet", schema=str(schema))
    dataset = Dataset(prepare(cfg, tmp_path / "cache", progress=False), cfg)
    assert dataset.num_rows == 330 and dataset.file_starts.tolist() == [0, 120, 200, 330]
    rows = np.array([329, 0, 150, 119, 200, 5])  # across all three files, out of order
    batch = dataset.batch(rows)
    assert batch.dense[:, 0].tolist() == rows.tolist()
    assert batch.lengths()[1].tolist() == (rows % 3).tolist()


def test_files_must_share_their_columns(tmp_path):
    folder = tmp_path / "clicks"
    folder.mkdir()
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: click\ndense: [price]\ncategorical: [tags]\n")
    pq.write_table(pa.table({"click": [0, 1], "price": [1.0, 2.0], "tags": ["a", "b"]}), folder / "a.parquet")
    pq.write_table(pa.table({"click": [0, 1], "price": [1.0, 2.0], "tags": [["a"], ["b", "c"]]}), folder / "b.parquet")
    with pytest.raises(DistrecError, match=r"b\.parquet has other columns than .*a\.parquet"):
        prepare(DataConfig(path=str(folder), format="parquet", schema=str(schema)), tmp_path / "cache", progress=False)


def test_a_batch_across_files_equals_one_file(days, tmp_path):
    folder, lines = days
    one = write(tmp_path / "all.tsv", [line for day in (0, 1, 2, 10) for line in lines[day]])
    single = Dataset(prepare(DataConfig(path=str(one), format="criteo"), tmp_path / "c1", progress=False))
    many = Dataset(prepare(DataConfig(path=str(folder), format="criteo"), tmp_path / "c2", progress=False))
    for rows in (np.random.default_rng(5).permutation(850)[:300], np.arange(310, 320), np.array([], np.int64)):
        a, b = single.batch(rows), many.batch(rows)
        for name in ("dense", "sparse_values", "sparse_offsets", "labels"):
            assert getattr(a, name).equal(getattr(b, name)), name


def test_files_split_holds_out_the_last_files(days, tmp_path):
    folder, _ = days
    dataset = Dataset(prepare(DataConfig(path=str(folder), format="criteo"), tmp_path / "cache", progress=False))
    split = dataset.split("files:1")
    assert split["train"].tolist() == list(range(750)) and split["val"].size == 0 and split["test"].tolist() == list(range(750, 850))
    split = dataset.split("files:2:1")
    assert split["train"].tolist() == list(range(300)) and split["val"].tolist() == list(range(300, 750)) and split["test"].tolist() == list(range(750, 850))
    with pytest.raises(DistrecError, match=r"holds out 4 of 4 input file\(s\), leaving none to train on"):
        dataset.split("files:3:1")
    for bad in ("files:0", "files:1.5", "files:-1:1", "files:1:1:1"):
        with pytest.raises(DistrecError, match="files:"):
            dataset.split(bad)


def test_input_positions_count_skipped_rows_over_files_in_order(tmp_path, monkeypatch):
    """Files prepared in parallel, in parts, one compressed: each kept row's input position
    (over the files concatenated) is its line's index, malformed lines counted."""
    rng = np.random.default_rng(6)
    folder = tmp_path / "criteo"
    folder.mkdir()
    lines = criteo_lines(rng, 900)
    for index in (0, 150, 151, 420, 899):  # the first line, two in a row, one in day 1, the last line of all
        lines[index] = "1\t2\t3"
    write(folder / "day_0", lines[:300])
    write(folder / "day_1.gz", lines[300:500], compress=True)
    write(folder / "day_2", lines[500:])
    monkeypatch.setattr(preparation, "MIN_PART_BYTES", 1)
    cfg = DataConfig(path=str(folder), format="criteo", chunk_rows=32, prepare_workers=2)  # plain days in parts of ~8 kB
    dataset = Dataset(prepare(cfg, tmp_path / "cache", progress=False))
    assert dataset.num_rows == 895 and dataset.manifest["malformed_rows"] == 5 and len(dataset.manifest[PARTS]) == 3
    rows = np.arange(895)
    assert dataset.input_positions(rows).tolist() == first_counts(dataset) == sorted(set(range(900)) - {0, 150, 151, 420, 899})
    assert dataset.input_positions(rows[::-1][:7]).tolist() == [898, 897, 896, 895, 894, 893, 892]  # any order


def test_input_positions_of_csv_and_parquet(tmp_path, monkeypatch):
    """A header line is no row; a blank or malformed line is one; Parquet numbers its rows."""
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: click\ndense: [price]\ncategorical: [user]\n")
    rng = np.random.default_rng(7)
    rows = [f"{rng.integers(0, 2)},{i},u{rng.integers(0, 50)}" for i in range(1500)]
    bad = {3: "1,2", 4: "", 700: "x,700,u1", 1499: "7,1499,u2"}  # wrong column counts, a blank line, bad labels
    for index, line in bad.items():
        rows[index] = line
    path = tmp_path / "clicks.csv"
    path.write_text("\n".join(["click,price,user", *rows]) + "\n")
    monkeypatch.setattr(preparation, "MIN_PART_BYTES", 1)
    cfg = DataConfig(path=str(path), format="csv", schema=str(schema), chunk_rows=32, prepare_workers=2)
    csv = Dataset(prepare(cfg, tmp_path / "cache", progress=False))
    assert csv.num_rows == 1496 and csv.manifest["malformed_lines"] == [5, 6, 702, 1501]  # physical lines: the header is line 1
    kept = np.arange(1496)
    assert csv.input_positions(kept).tolist() == csv.batch(kept).dense[:, 0].int().tolist() == sorted(set(range(1500)) - set(bad))
    table = pa.table({"click": [0, None, 1, 1, 5, 0], "price": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "user": list("abcdef")})
    pq.write_table(table, tmp_path / "clicks.parquet")
    parquet = Dataset(prepare(DataConfig(path=str(tmp_path / "clicks.parquet"), format="parquet", schema=str(schema)), tmp_path / "cache", progress=False))
    assert parquet.input_positions(np.arange(4)).tolist() == [0, 2, 3, 5]
