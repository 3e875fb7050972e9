import numpy as np
import pytest

from distrec.data.source import MalformedRows
from distrec.data.textfile import CsvStream, read_header
from distrec.errors import DistrecError


@pytest.mark.parametrize("header", [False, True])
def test_line_numbers_of_kept_rows_skip_bad_lines(tmp_path, header):
    rng = np.random.default_rng(3)
    good_lines, text = [], ["a,b,c"] if header else []
    for i in range(500):
        line = len(text) + 1
        if rng.random() < 0.2:
            text.append(",".join(["9"] * int(rng.choice([1, 2, 4]))))  # wrong column count
        else:
            text.append(f"{line},x,y")  # first field: its own line number
            good_lines.append(line)
    path = tmp_path / "f.csv"
    path.write_text("\n".join(text) + "\n")
    malformed = MalformedRows(path)
    stream = CsvStream(path, ",", False, malformed, chunk_rows=7,
                       column_names=None if header else ["a", "b", "c"], text_columns=["a"])
    seen = []
    for batch, first in stream:
        lines = stream.line_numbers(first + np.arange(batch.num_rows))
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
