import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distrec.data.columns import hash_strings
from distrec.data.source import Chunk
from distrec.data.tabular import load_schema, read_tabular
from distrec.errors import DistrecError

SCHEMA = """
label: rating
threshold: 4
dense: [age, price]
categorical:
  - user
  - {name: tags, separator: "|"}
"""

CSV = """user,age,rating,price,tags,unused
u1,20,5,1.5,a|b,x
u2,,3,2,,x
u1,31,4,abc,b,x
u3,40,,1,a,x
u2,50,2,0.5,c||a,x
"""


def read_all(path, schema, fmt, **kwargs):
    source = read_tabular(path, schema, fmt, **kwargs)
    return source, Chunk.concat(list(source.chunks), len(source.dense), len(source.features))


def write(path, text):
    path.write_text(text)
    return path


def test_csv_with_schema(tmp_path):
    schema = write(tmp_path / "s.yaml", SCHEMA)
    source, chunk = read_all(write(tmp_path / "d.csv", CSV), schema, "csv", chunk_rows=2)
    assert [f.name for f in source.features] == ["user", "tags"]
    assert [f.multi_hot for f in source.features] == [False, True]
    assert chunk.labels.tolist() == [1.0, 0.0, 0.0]  # rating >= 4
    np.testing.assert_array_equal(chunk.dense, [[20, 1.5], [0, 2], [50, 0.5]])  # missing age = 0
    assert source.malformed.count == 2
    assert source.malformed.first[0][0] == 4 and "price" in source.malformed.first[0][1]  # line 4: price abc
    assert source.malformed.first[1][0] == 5 and "label" in source.malformed.first[1][1]  # line 5: no rating
    users, _ = chunk.sparse[0]
    assert users[0] != users[1] and users[0] == hash_strings(pa.array(["u1"]))[0]
    tags, lengths = chunk.sparse[1]
    assert lengths.tolist() == [2, 0, 2]  # "a|b", "", "c||a" (empty items dropped)
    a, b, c = hash_strings(pa.array(["a", "b", "c"]))
    assert tags.tolist() == [a, b, c, a]


def test_parquet_matches_csv_and_list_columns(tmp_path):
    schema = write(tmp_path / "s.yaml", SCHEMA)
    table = pa.table(
        {
            "user": ["u1", "u2", "u3"],
            "age": [20, None, 40],
            "rating": [5.0, 3.0, 4.0],
            "price": [1.5, 2.0, 1.0],
            "tags": [["a", "b"], None, ["c"]],
        }
    )
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=2)
    source, chunk = read_all(tmp_path / "d.parquet", schema, "parquet", chunk_rows=2)
    assert source.features[1].multi_hot
    assert chunk.labels.tolist() == [1.0, 0.0, 1.0]
    np.testing.assert_array_equal(chunk.dense, [[20, 1.5], [0, 2], [40, 1]])
    csv = write(tmp_path / "d.csv", "user,age,rating,price,tags\nu1,20,5,1.5,a|b\nu2,,3,2,\nu3,40,4,1,c\n")
    _, from_csv = read_all(csv, schema, "csv")
    for (va, la), (vb, lb) in zip(chunk.sparse, from_csv.sparse):
        np.testing.assert_array_equal(va, vb)
        np.testing.assert_array_equal(la, lb)


def test_headerless_csv_with_delimiter_and_binary_label(tmp_path):
    schema = write(tmp_path / "s.yaml", "label: y\ndense: [x]\ncategorical: [c]\ndelimiter: ';'\nheader: false\ncolumns: [y, x, c]\n")
    source, chunk = read_all(write(tmp_path / "d.csv", "1;0.5;p\n0;1;q\n3;1;q\n"), schema, "csv")
    assert chunk.labels.tolist() == [1.0, 0.0]
    assert source.malformed.first[0][0] == 3 and "threshold" in source.malformed.first[0][1]


def test_strict_mode(tmp_path):
    schema = write(tmp_path / "s.yaml", SCHEMA)
    with pytest.raises(DistrecError, match=r"d\.csv: line 4: 'price' is not a finite number"):
        read_all(write(tmp_path / "d.csv", CSV), schema, "csv", strict=True)


def test_avazu_sample(shared_data, tmp_path):
    columns = [
        "hour",
        "C1",
        "banner_pos",
        "site_id",
        "site_domain",
        "site_category",
        "app_id",
        "app_domain",
        "app_category",
        "device_id",
        "device_ip",
        "device_model",
        "device_type",
        "device_conn_type",
        "C14",
        "C15",
        "C16",
        "C17",
        "C18",
        "C19",
        "C20",
        "C21",
    ]
    schema = write(tmp_path / "avazu.yaml", "label: click\ncategorical: [" + ", ".join(columns) + "]\n")
    source, chunk = read_all(shared_data / "avazu" / "avazu_sample.csv", schema, "csv", chunk_rows=100)
    assert chunk.num_rows == 499 and source.malformed.count == 0
    assert 0 < chunk.labels.mean() < 0.5
    assert chunk.dense.shape == (499, 0)
    site_id = chunk.sparse[3][0]
    assert (site_id >= 1).all() and site_id[0] == site_id[1]  # first two rows share site 1fbe01fe
    assert len(np.unique(chunk.sparse[10][0])) > 100  # device_ip is nearly unique


def test_fnv1a_reference_value():
    # FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (reference test vectors); raw id = (h >> 2) + 1
    assert hash_strings(pa.array(["a", "", None])).tolist() == [(0xAF63DC4C8601EC8C >> 2) + 1, 0, 0]
    assert hash_strings(pa.array([7])).tolist() == hash_strings(pa.array(["7"])).tolist()


@pytest.mark.parametrize(
    "text, message",
    [
        ("label: [unclosed", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("dense: [x]\n", "`label:` must name"),
        ("label: y\ncategorical: [c]\nlables: 1\n", "unknown key 'lables'"),
        ("label: y\n", "at least one"),
        ("label: y\ndense: x\n", "`dense:` must be a list"),
        ("label: y\ndense: [x]\nthreshold: high\n", "`threshold:` must be a number"),
        ("label: y\ndense: [x]\nheader: false\n", "needs `columns:`"),
        ("label: y\ndense: [x, x]\n", "used twice"),
        ("label: y\ncategorical: [{name: t, sep: ','}]\n", "categorical entry"),
        ("label: y\ndense: [{name: x, transform: log}]\n", "transform of 'x' is 'log'; choose one of auto, log1p, standardize, none"),
        ("label: y\ndense: [{name: x, scale: 2}]\n", "dense entry"),
    ],
)
def test_schema_errors(tmp_path, text, message):
    with pytest.raises(DistrecError, match=message):
        load_schema(write(tmp_path / "s.yaml", text))


def test_schema_naming_a_missing_column(tmp_path):
    schema = write(tmp_path / "s.yaml", "label: rating\ncategorical: [nope]\n")
    with pytest.raises(DistrecError, match="names column 'nope', which is not in"):
        read_tabular(write(tmp_path / "d.csv", CSV), schema, "csv")
    pq.write_table(pa.table({"rating": [1]}), tmp_path / "d.parquet")
    with pytest.raises(DistrecError, match="names column 'nope'"):
        read_tabular(tmp_path / "d.parquet", schema, "parquet")


def test_missing_schema_and_bad_parquet(tmp_path):
    data = write(tmp_path / "d.csv", CSV)
    with pytest.raises(DistrecError, match="schema file .* not found; check --schema"):
        read_tabular(data, tmp_path / "none.yaml", "csv")
    schema = write(tmp_path / "s.yaml", SCHEMA)
    with pytest.raises(DistrecError, match="as Parquet"):
        read_tabular(data, schema, "parquet")


NON_FINITE_CSV = """y,a,c
1,1e39,x
0,inf,y
1,nan,z
0,-Infinity,w
1,1e400,v
0,2.5,u
1,,t
"""


def test_non_finite_and_float32_overflow_dense_values_are_malformed(tmp_path):
    # regression: 1e39 became float32 inf in the cache; text inf/nan became 0 uncounted
    schema = write(tmp_path / "s.yaml", "label: y\ndense: [a]\ncategorical: [c]\n")
    source, chunk = read_all(write(tmp_path / "d.csv", NON_FINITE_CSV), schema, "csv")
    assert chunk.dense[:, 0].tolist() == [2.5, 0.0]  # only the finite row and the missing one (= 0)
    assert source.malformed.count == 5
    assert [line for line, _ in source.malformed.first] == [2, 3, 4, 5, 6]
    assert "float32" in source.malformed.first[0][1] and "not a finite number" in source.malformed.first[1][1]
    with pytest.raises(DistrecError, match="line 2: 'a' is beyond float32"):
        list(read_tabular(tmp_path / "d.csv", schema, "csv", strict=True).chunks)


def test_parquet_infinite_and_float32_overflow_are_malformed_nan_is_missing(tmp_path):
    schema = write(tmp_path / "s.yaml", "label: y\ndense: [a]\ncategorical: [c]\n")
    a = [1e39, np.inf, np.nan, 2.5, -np.inf]
    pq.write_table(pa.table({"y": [1.0, 0.0, 1.0, 0.0, np.inf], "a": pa.array(a, pa.float64()), "c": list("xyzwv")}), tmp_path / "d.parquet")
    source, chunk = read_all(tmp_path / "d.parquet", schema, "parquet")
    assert chunk.dense[:, 0].tolist() == [0.0, 2.5] and chunk.labels.tolist() == [1.0, 0.0]
    assert source.malformed.count == 3 and [row for row, _ in source.malformed.first] == [1, 2, 5]


def test_corrupt_parquet_page_is_one_line(tmp_path):
    # regression: a damaged page header raised OSError "Couldn't deserialize thrift" from the batch loop
    schema = write(tmp_path / "s.yaml", "label: y\ndense: [a]\ncategorical: [c]\n")
    table = pa.table({"y": [1, 0] * 4000, "a": np.arange(8000, dtype=np.float64), "c": ["x", "y", "z", "w"] * 2000})
    pq.write_table(table, tmp_path / "d.parquet", data_page_size=1024)
    raw = bytearray((tmp_path / "d.parquet").read_bytes())
    raw[4:20] = b"\xab" * 16  # the first page header
    (tmp_path / "d.parquet").write_bytes(bytes(raw))
    source = read_tabular(tmp_path / "d.parquet", schema, "parquet")
    with pytest.raises(DistrecError, match=r"d\.parquet is corrupt after row 0 \(.*\); re-export the Parquet file"):
        list(source.chunks)


def test_dense_transforms_are_fitted_on_the_training_rows_and_applied_to_every_batch(tmp_path):
    from distrec.config import DataConfig
    from distrec.data import Dataset, prepare

    schema = write(
        tmp_path / "s.yaml", "label: y\ndense: [count, {name: delta, transform: auto}, {name: z, transform: standardize}, {name: raw, transform: none}]\n"
    )
    lines = ["y,count,delta,z,raw"] + [f"{i % 2},{10 * i},{i - 5},{i},{i * 100}" for i in range(10)]
    data = DataConfig(path=str(write(tmp_path / "d.csv", "\n".join(lines) + "\n")), format="csv", schema=str(schema), cache_dir=str(tmp_path / "cache"))
    assert read_tabular(data.path, schema, "csv").description["dense_transforms"] == ["auto", "auto", "standardize", "none"]
    dataset = Dataset(prepare(data, progress=False), data)
    train = np.arange(6)  # the held-out rows 6-9 do not count
    dataset.fit_dense_transforms(train)
    fitted = {t.name: t for t in dataset.dense_transforms}
    assert fitted["count"].kind == "log1p" and fitted["raw"].kind == "none"
    assert fitted["delta"].kind == "standardize" and fitted["delta"].mean == pytest.approx(-2.5)  # a negative value: no log
    assert (fitted["z"].mean, fitted["z"].std) == pytest.approx((2.5, np.std(np.arange(6))))
    dense = dataset.batch(np.array([9, 0])).dense.numpy()
    np.testing.assert_allclose(dense[:, 0], np.log1p([90, 0]), rtol=1e-6)
    np.testing.assert_allclose(dense[:, 2], (np.array([9, 0]) - 2.5) / np.std(np.arange(6)), rtol=1e-6)
    np.testing.assert_allclose(dense[:, 3], [900, 0])
    scoring = Dataset(prepare(data, progress=False), data)  # as evaluate and predict read a trained model's data
    assert scoring.batch(np.array([9])).dense[0, 0] == 90  # the cache keeps raw values
    scoring.use_dense_transforms([t.to_dict() for t in dataset.dense_transforms])
    assert scoring.batch(np.array([9, 0])).dense.equal(dataset.batch(np.array([9, 0])).dense)
