"""Table descriptions from YAML/JSON files, with clear errors."""

import json

import pytest

from distrec.errors import DistrecError
from distrec.planner.table_file import DEFAULT_HISTOGRAM, load_table_specs


def test_yaml_and_json_lists_load(tmp_path):
    y = tmp_path / "tables.yaml"
    y.write_text("- {name: user, rows: 1000, dim: 64, pooling_factor: 1}\n- {name: hist, rows: 50, dim: 8, pooling_factor: 20.5}\n")
    tables = load_table_specs(y)
    assert [(t.name, t.num_rows, t.dim, t.pooling_factor) for t in tables] == [("user", 1000, 64, 1.0), ("hist", 50, 8, 20.5)]
    assert tables[0].histogram == pytest.approx(DEFAULT_HISTOGRAM)
    j = tmp_path / "tables.json"
    hist = [2, 1, 1] + [0] * 14
    j.write_text(json.dumps({"tables": [{"name": "a", "rows": 10, "dim": 4, "pooling_factor": 2, "histogram": hist}]}))
    (a,) = load_table_specs(j)
    assert a.histogram[:3] == (0.5, 0.25, 0.25)  # normalised


@pytest.mark.parametrize(
    "text,message",
    [
        ("- {name: a, rows: 10, dim: 4}\n", "missing keys \\['pooling_factor'\\]"),
        ("- {name: a, rows: 10, dim: 4, pooling_factor: 1, colour: red}\n", "unknown keys \\['colour'\\]"),
        ("- {name: a, rows: ten, dim: 4, pooling_factor: 1}\n", "rows and dim must be integers"),
        ("- {name: a, rows: 10.5, dim: 4, pooling_factor: 1}\n", "whole numbers"),
        ("- {name: a, rows: 0, dim: 4, pooling_factor: 1}\n", "at least 1"),
        ("- {name: a, rows: 10, dim: 4, pooling_factor: 1, histogram: [1, 2]}\n", "17"),
        ("- {name: a, rows: 10, dim: 4, pooling_factor: 1}\n- {name: a, rows: 10, dim: 4, pooling_factor: 1}\n", "more than once"),
        ("tables: 3\n", "non-empty list"),
        ("- [unclosed\n", "not valid YAML"),
    ],
)
def test_malformed_files_name_the_problem(tmp_path, text, message):
    p = tmp_path / "t.yaml"
    p.write_text(text)
    with pytest.raises(DistrecError, match=message):
        load_table_specs(p)


def test_missing_file(tmp_path):
    with pytest.raises(DistrecError, match="not found"):
        load_table_specs(tmp_path / "nope.yaml")
