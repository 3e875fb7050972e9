import numpy as np
import pytest

from distrec.data import textfile
from distrec.data.source import MalformedRows
from distrec.data.textfile import CsvStream, read_header
from distrec.errors import DistrecError


@pytest.mark.parametrize("header", [False, True])
def test_line_numbers_of_kept_rows_skip_bad_lines(tmp_path, header):
    rng = np.random.default_rng(3)
    good_lines, text = [], ["a,b,c"] if header else []
    for _ in range(500):
        line = len(text) + 1
        if rng.random() < 0.2:
            text.append(",".join(["9"] * int(rng.choice([1, 2, 4]))))  # wrong column count
        else:
            text.append(f"{line},x,y")  # first field: its own line number
            good_lines.append(line)
    path = tmp_path / "f.csv"
    path.write_text("\n".join(text) + "\n")
    malformed = MalformedRows(path)
    stream = CsvStream(path, ",", False, malformed, chunk_rows=7, column_names=None if header else ["a", "b", "c"], text_columns=["a"])
    seen = []
    for batch, line_numbers in stream:
        lines = line_numbers(np.arange(batch.num_rows))
        assert batch.num_rows <= 7
        assert lines.tolist() == [int(v) for v in batch.column("a").to_pylist()]
        seen += lines.tolist()
    assert seen == good_lines
    assert malformed.count == 500 - len(good_lines)


def test_header_and_empty_file(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text('"x y",b\n1,2\n')
    assert read_header(path, ",") == ["x y", "b"]
    empty = tmp_path / "e.csv"
    empty.write_text("")
    assert list(CsvStream(empty, ",", False, MalformedRows(empty), 10, column_names=["a"])) == []
    with pytest.raises(DistrecError, match="is empty"):
        read_header(empty, ",")


@pytest.mark.parametrize("name", ["f.tsv", "f.tsv.gz"])
def test_binary_input_is_one_line_naming_the_file(tmp_path, name):
    # regression: an executable given as --data printed "Exception ignored ... UnicodeDecodeError"
    # and an error holding raw binary bytes
    import gzip

    blob = bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)) + b"\0\x7fELF\t\t\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(blob) if name.endswith(".gz") else blob)
    stream = CsvStream(path, "\t", False, MalformedRows(path), chunk_rows=10, column_names=["a", "b"], text_columns=["a"])
    with pytest.raises(DistrecError, match=rf"{name} is a binary file, not delimited text; check --data") as e:
        list(stream)
    assert "\n" not in str(e.value) and str(e.value).isprintable()
    with pytest.raises(DistrecError, match="binary file"):
        read_header(path, ",")


def test_fraction_read_follows_the_rows_of_a_plain_file(tmp_path, monkeypatch):
    path = tmp_path / "f.csv"
    path.write_text("".join(f"{i},{'x' * (i % 7)}\n" for i in range(1000)))
    stream = CsvStream(path, ",", False, MalformedRows(path), chunk_rows=100, column_names=["a", "b"], text_columns=["a", "b"])
    fractions = [stream.fraction_read() for _batch in stream]
    assert fractions == sorted(fractions) and len(fractions) == 10
    assert fractions[-1] == pytest.approx(1.0) and fractions[0] == pytest.approx(0.1, abs=0.02)
    monkeypatch.setattr(textfile, "_MIN_BLOCK_BYTES", 600)  # several blocks: each block's bytes go to its rows
    stream = CsvStream(path, ",", False, MalformedRows(path), chunk_rows=1, column_names=["a", "b"], text_columns=["a", "b"])
    fractions = [stream.fraction_read() for _batch in stream]
    assert fractions == sorted(fractions) and len(fractions) == 1000 and fractions[-1] == pytest.approx(1.0)
    assert fractions[99] == pytest.approx(0.1, abs=0.02) and fractions[499] == pytest.approx(0.5, abs=0.02)


def test_a_non_utf8_line_with_the_wrong_field_count_is_one_line(tmp_path, capsys):
    # regression: Arrow printed "Exception ignored ... UnicodeDecodeError" before the parse error
    path = tmp_path / "f.tsv"
    path.write_bytes(b"1\t2\n3\t4\ncaf\xe9\n5\t6\n")
    stream = CsvStream(path, "\t", False, MalformedRows(path), chunk_rows=10, column_names=["a", "b"], text_columns=["a"])
    with pytest.raises(DistrecError, match=r"f\.tsv: a line with the wrong number of fields is not UTF-8 text \(.*Row #3"):
        list(stream)
    assert capsys.readouterr().err == ""
