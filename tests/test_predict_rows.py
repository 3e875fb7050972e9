"""``distrec predict``'s ``row`` column: each score's row is its position in the input,
the malformed rows predict skips counted, so the scores join back to the input's lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from distrec.config import SyntheticConfig
from distrec.data.synthetic import synthesize
from distrec.train.loop import train
from test_serving import cli, scores_of
from tiny_runs import tiny_config


def with_bad_lines(lines: list[str], bad: dict[int, str]) -> tuple[list[str], list[int]]:
    """``lines`` with the lines ``bad`` inserted at those final indices (ascending), and the
    indices the original lines end at."""
    out, kept, source = [], [], iter(lines)
    for index in range(len(lines) + len(bad)):
        if index in bad:
            out.append(bad[index])
        else:
            out.append(next(source))
            kept.append(index)
    return out, kept


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def same_scores(scores: np.ndarray, expected: np.ndarray) -> bool:
    """The same rows' scores, to float32 rounding (the forward pass is not bitwise repeatable)."""
    return scores.shape == expected.shape and float(np.abs(scores - expected).max()) <= 1e-6


def predicted(capsys, run: Path, out: Path, data: Path | list[Path], *flags: str) -> tuple[dict, np.ndarray, np.ndarray]:
    """predict's result, rows and scores on ``data``, in batches of 64 (several across the skipped rows)."""
    paths = data if isinstance(data, list) else [data]
    result = cli(capsys, "predict", "--checkpoint", run, "--data", *paths, *flags, "--batch-size", 64, "-o", out)
    rows, scores, _ = scores_of(out)
    return result, rows, scores


@pytest.fixture(scope="module")
def criteo_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A run trained on a 300-line Criteo TSV, and the file's lines."""
    root = tmp_path_factory.mktemp("criteo-run")
    data = synthesize(SyntheticConfig(rows=300, num_sparse=26, table_rows=1000, pooling_factor=1), root / "clicks.tsv", progress=False)
    cfg = tiny_config(root / "cache", 3, ('data.format="criteo"', f"data.path={json.dumps(str(data))}", "data.max_ind_range=101"))
    train(cfg, root / "run", progress=False)
    return root / "run", data.read_text().splitlines()


def test_criteo_rows_are_input_positions_past_skipped_lines(criteo_run, tmp_path, capsys):
    run, lines = criteo_run
    clean, clean_rows, clean_scores = predicted(capsys, run, tmp_path / "clean.parquet", write_lines(tmp_path / "clean.tsv", lines), "--data-format", "criteo")
    assert clean["malformed_rows"] == 0 and clean_rows.tolist() == list(range(300))  # without malformed rows: 0..n-1, as before
    hashes_bad = lines[5].split("\t")
    hashes_bad[20] = "not-hex"
    bad = {0: "1\t2\t3", 100: "x" + lines[7][1:], 101: "\t".join(hashes_bad), 102: "", 303: "1\t2\t3"}  # first, three in a row, the last line
    dirty, kept = with_bad_lines(lines, bad)
    result, rows, scores = predicted(capsys, run, tmp_path / "dirty.csv", write_lines(tmp_path / "dirty.tsv", dirty), "--data-format", "criteo")
    assert result["malformed_rows"] == 5 and result["malformed_lines"] == [1, 101, 102, 103, 304]
    assert rows.tolist() == kept and same_scores(scores, clean_scores)
    # two files, each with a malformed row (the second compressed): positions over both, in the order read
    first, second = tmp_path / "a" / "day_0.tsv", tmp_path / "a" / "day_1.tsv"
    first.parent.mkdir()
    with_first, kept_first = with_bad_lines(lines[:120], {50: "1\t2"})
    with_second, kept_second = with_bad_lines(lines[120:], {10: "2" + lines[9][1:]})
    write_lines(first, with_first)
    write_lines(second, with_second)
    result, rows, scores = predicted(capsys, run, tmp_path / "files.parquet", [first, second], "--data-format", "criteo")
    assert result["malformed_lines"] == {str(first.resolve()): [51], str(second.resolve()): [11]}  # regression: a KeyError for several files
    assert result["malformed_rows"] == 2 and rows.tolist() == kept_first + [121 + i for i in kept_second]
    assert same_scores(scores, clean_scores)


def test_csv_rows_are_input_positions_past_skipped_lines(tmp_path, capsys):
    """The header line is no row; a malformed or blank line is one."""
    rng = np.random.default_rng(0)
    n = 400
    lines = [f"{rng.integers(0, 2)},{rng.integers(0, 5000)},s{i % 7}" for i in range(n)]
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: y\ndense: [count]\ncategorical: [site]\n")
    clean = write_lines(tmp_path / "clean.csv", ["y,count,site", *lines])
    overrides = ('data.format="csv"', f"data.path={json.dumps(str(clean))}", f"data.schema={json.dumps(str(schema))}")
    train(tiny_config(tmp_path / "cache", 3, overrides), tmp_path / "run", progress=False)
    flags = ("--data-format", "csv", "--schema", str(schema))
    result, clean_rows, clean_scores = predicted(capsys, tmp_path / "run", tmp_path / "clean.parquet", clean, *flags)
    assert result["malformed_rows"] == 0 and clean_rows.tolist() == list(range(n))
    bad = {3: "1,2", 64: "", 65: "yes,3,s1", 200: "4,10,s2"}  # wrong column count, blank, a label not a number, not 0/1
    dirty, kept = with_bad_lines(lines, bad)
    result, rows, scores = predicted(capsys, tmp_path / "run", tmp_path / "dirty.csv", write_lines(tmp_path / "dirty.csv", ["y,count,site", *dirty]), *flags)
    assert result["malformed_rows"] == 4 and result["malformed_lines"] == [5, 66, 67, 202]  # lines of the file: the header is line 1
    assert rows.tolist() == kept and same_scores(scores, clean_scores)
