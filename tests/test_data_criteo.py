import gzip

import numpy as np
import pytest

from distrec.data import criteo
from distrec.data.criteo import CriteoWriter, read_criteo
from distrec.data.source import Chunk
from distrec.errors import DistrecError


def criteo_line(label="0", ints=None, cats=None) -> str:
    ints = ints if ints is not None else ["1"] * 13
    cats = cats if cats is not None else ["68fd1e64"] * 26
    return "\t".join([label, *ints, *cats])


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def read_all(path, **kwargs):
    source = read_criteo(path, **kwargs)
    chunks = list(source.chunks)
    return source, Chunk.concat(chunks, 13, 26)


def test_empty_fields_negative_ints_and_hashes(tmp_path):
    ints = ["", "-3", "0", "7"] + ["1"] * 9
    cats = ["", "0000000a", "FFFFFFFF"] + ["68fd1e64"] * 23
    _, chunk = read_all(write(tmp_path / "a.tsv", [criteo_line("1", ints, cats)]))
    assert chunk.labels.tolist() == [1.0]
    np.testing.assert_allclose(chunk.dense[0, :4], [0.0, 0.0, 0.0, np.log(8.0)], rtol=1e-6)
    raw = [values[0] for values, _ in chunk.sparse[:4]]
    assert raw == [0, 0xA + 1, 0xFFFFFFFF + 1, 0x68FD1E64 + 1]
    assert all(lengths.tolist() == [1] for _, lengths in chunk.sparse)


def test_malformed_rows_skipped_counted_and_located(tmp_path):
    lines = [
        criteo_line("0"),  # 1 ok
        "\t".join(["1"] * 39),  # 2 too few columns
        criteo_line("1"),  # 3 ok
        criteo_line("0") + "\textra",  # 4 too many columns
        criteo_line("0", ints=["x1"] + ["1"] * 12),  # 5 non-numeric integer
        criteo_line("1", ints=["1.5"] + ["1"] * 12),  # 6 not an integer
        criteo_line("0", cats=["zz"] + ["1"] * 25),  # 7 not hex
        criteo_line("2"),  # 8 label not 0/1
        "",  # 9 empty line
        criteo_line("1"),  # 10 ok
    ]
    source, chunk = read_all(write(tmp_path / "bad.tsv", lines), chunk_rows=2)
    assert chunk.labels.tolist() == [0.0, 1.0, 1.0]
    assert source.malformed.count == 7
    assert [line for line, _ in source.malformed.first] == [2, 4, 5, 6, 7]
    reasons = dict(source.malformed.first)
    assert "columns" in reasons[2] and "I1" in reasons[5] and "C1" in reasons[7]


def test_strict_names_file_and_first_bad_line(tmp_path):
    path = write(tmp_path / "bad.tsv", [criteo_line("0"), criteo_line("0"), criteo_line("0", ints=["abc"] + ["1"] * 12)])
    with pytest.raises(DistrecError, match=r"bad\.tsv: line 3: I1 is not an integer"):
        read_all(path, strict=True)


def test_gzip_equals_plain(tmp_path, shared_data):
    plain = shared_data / "criteo" / "criteo_kaggle_tiny.tsv"
    packed = tmp_path / "tiny.tsv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    _, a = read_all(plain, chunk_rows=64)
    _, b = read_all(packed, chunk_rows=50)
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.labels, b.labels)
    for (va, la), (vb, lb) in zip(a.sparse, b.sparse):
        np.testing.assert_array_equal(va, vb)
        np.testing.assert_array_equal(la, lb)


def test_kaggle_sample(shared_data):
    source, chunk = read_all(shared_data / "criteo" / "criteo_kaggle_sample.tsv", chunk_rows=1000)
    assert chunk.num_rows == 4380 and source.malformed.count == 0
    assert 0.2 < chunk.labels.mean() < 0.24  # the README's 22% clicks
    assert (chunk.dense >= 0).all() and (chunk.dense > 0).any()
    missing = np.mean([np.mean(values == 0) for values, _ in chunk.sparse])
    assert 0 < missing < 0.2  # some categorical values are empty, most are present


def test_tiny_sample_first_row(shared_data):
    _, chunk = read_all(shared_data / "criteo" / "criteo_kaggle_tiny.tsv")
    assert chunk.num_rows == 200
    # first line: 0  1 1 5 0 1382 4 15 2 181 1 2 <empty> 2  68fd1e64 ...
    np.testing.assert_allclose(chunk.dense[0, :3], np.log1p([1, 1, 5]), rtol=1e-6)
    assert chunk.dense[0, 11] == 0.0
    assert chunk.sparse[0][0][0] == 0x68FD1E64 + 1


def test_writer_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    n = 50
    counts = rng.integers(0, 1000, (n, 13))
    raw = [np.where(rng.random(n) < 0.2, 0, rng.integers(1, 1 << 32, n)) for _ in range(26)]
    chunk = Chunk(np.log1p(counts).astype(np.float32), (rng.random(n) < 0.3).astype(np.float32), [(r, np.ones(n, np.int32)) for r in raw])
    with CriteoWriter(tmp_path / "out.tsv.gz") as writer:
        writer.write(chunk)
    _, back = read_all(tmp_path / "out.tsv.gz")
    np.testing.assert_array_equal(back.dense, chunk.dense)
    np.testing.assert_array_equal(back.labels, chunk.labels)
    for (values, _), expected in zip(back.sparse, raw):
        np.testing.assert_array_equal(values, expected)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DistrecError, match="not found; check --data"):
        read_criteo(tmp_path / "nope.tsv")


def test_dense_counts_beyond_float64_precision_parse_and_overflow_is_malformed(tmp_path):
    # regression: 2**53 + 1 made Arrow's int64 -> float64 cast raise ArrowInvalid for the whole file
    huge = ["9007199254740993", "9223372036854775807", "99999999999999999999"] + ["1"] * 10
    beyond_float64 = ["9" * 400] + ["1"] * 12
    source, chunk = read_all(write(tmp_path / "a.tsv", [criteo_line("1", huge), criteo_line("0", beyond_float64)]))
    assert chunk.num_rows == 1 and source.malformed.count == 1
    assert source.malformed.first[0][0] == 2 and "I1" in source.malformed.first[0][1]
    np.testing.assert_allclose(chunk.dense[0, :3], np.log1p([2.0**53, 2.0**63, 1e20]), rtol=1e-6)
    assert np.isfinite(chunk.dense).all()
    with pytest.raises(DistrecError, match="line 2: I1 is not an integer"):
        list(read_criteo(tmp_path / "a.tsv", strict=True).chunks)


def test_non_utf8_bytes_in_a_count_make_a_malformed_row(tmp_path):
    # a latin-1 byte in an integer field raised ArrowInvalid "Invalid UTF8 sequence" from the slow parsing path
    path = tmp_path / "a.tsv"
    lines = [criteo_line("1"), criteo_line("0", ["caf\xe9"] + ["1"] * 12), criteo_line("1", ["+7", " 8 "] + ["1"] * 11)]
    path.write_bytes("".join(line + "\n" for line in lines).encode("latin-1"))
    source, chunk = read_all(path)
    assert chunk.num_rows == 2 and source.malformed.first == [(2, "I1 is not an integer")]
    np.testing.assert_allclose(chunk.dense[1, :2], np.log1p([7.0, 8.0]), rtol=1e-6)


def _read_with_arrow_only(path, monkeypatch, **kwargs):
    monkeypatch.setattr(criteo, "_parse_clean", lambda block: None)
    try:
        return read_all(path, **kwargs)
    finally:
        monkeypatch.undo()


def assert_same_chunks(a, b):
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.labels, b.labels)
    for (va, la), (vb, lb) in zip(a.sparse, b.sparse):
        np.testing.assert_array_equal(va, vb)
        np.testing.assert_array_equal(la, lb)


def random_lines(rng, n, dirty):
    """Criteo lines with empty, negative and long counts, upper- and lower-case hashes of 1 to
    16 digits; with ``dirty``, also lines only Arrow reads (CR, plus signs, spaces, 19 digits)
    and malformed ones."""
    lines = []
    for _ in range(n):
        ints = [rng.choice(["", "0", "-0", "-7", "12", "007", "999999999999999999", str(rng.integers(0, 1 << 62))]) for _ in range(13)]
        cats = [rng.choice(["", "68fd1e64", "0000000A", "fFfFfFfF", "1", "123456789abcdef"]) for _ in range(26)]
        line = "\t".join([str(rng.integers(0, 2)), *ints, *cats])
        if dirty and rng.random() < 0.05:
            line = rng.choice(
                [
                    line + "\r",
                    line.replace("\t12\t", "\t+12\t"),
                    line.replace("\t7\t", "\t 7\t"),
                    "\t".join(["1", "9" * 19, *ints[1:], *cats]),
                    "",
                    "2" + line[1:],
                    line + "\tx",
                    "\t".join(["0", *ints, "123456789abcdef0", *cats[1:]]),
                ]
            )
        lines.append(line)
    return lines


@pytest.mark.parametrize("dirty", [False, True])
def test_the_compiled_parser_gives_arrows_rows(tmp_path, monkeypatch, dirty):
    path = write(tmp_path / "mixed.tsv", random_lines(np.random.default_rng(7 + dirty), 3000, dirty))
    source, fast = read_all(path, chunk_rows=500)
    arrow_source, arrow = _read_with_arrow_only(path, monkeypatch, chunk_rows=500)
    assert_same_chunks(fast, arrow)
    assert source.malformed.count == arrow_source.malformed.count and source.malformed.first == arrow_source.malformed.first
    assert (source.malformed.count > 0) == dirty


def test_the_compiled_parser_reads_the_kaggle_sample_as_arrow_does(shared_data, monkeypatch):
    path = shared_data / "criteo" / "criteo_kaggle_sample.tsv"
    _, fast = read_all(path)
    _, arrow = _read_with_arrow_only(path, monkeypatch)
    assert_same_chunks(fast, arrow)
