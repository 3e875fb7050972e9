"""Bad input among many files keeps the command line's contract: one line naming the file
(and the line where known), exit status 2, no traceback, and the caches of the files
before it kept."""

import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import distrec.data.preparation as preparation
from distrec.cli import main
from distrec.config import DataConfig
from distrec.data import prepare, read_manifest
from distrec.errors import DistrecError


def criteo_file(path, rows, seed, compress=False):
    rng = np.random.default_rng(seed)
    text = "".join(
        "\t".join([str(rng.integers(0, 2)), *map(str, rng.integers(0, 99, 13)), *(f"{h:08x}" for h in rng.integers(0, 1 << 32, 26))]) + "\n"
        for _ in range(rows)
    )
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
    return path


def one_line_error(capsys, *argv) -> str:
    """The one stderr line of ``distrec argv``, which must exit with status 2."""
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and "Traceback" not in err and len(lines) == 1 and lines[0].startswith("distrec: error: "), err
    return lines[0]


def prepare_args(cache, *paths, workers=2):
    return ["data", "prepare", "--data-format", "criteo", "--cache-dir", cache, "--no-progress", "--set", f"data.prepare_workers={workers}", "--data", *paths]


def cached_files(cache) -> list[str]:
    """The input files whose caches are complete under ``cache``."""
    return sorted(read_manifest(d)["source"]["path"].rsplit("/", 1)[1] for d in cache.iterdir() if (d / "manifest.json").is_file() and "-set-" not in d.name)


def test_a_missing_file_in_a_list_is_named_before_anything_is_parsed(capsys, tmp_path):
    day_0 = criteo_file(tmp_path / "day_0", 50, 0)
    line = one_line_error(capsys, *prepare_args(tmp_path / "cache", day_0, tmp_path / "day_1", criteo_file(tmp_path / "day_2", 50, 2)))
    assert "data file" in line and "day_1' not found; check --data" in line
    assert not (tmp_path / "cache").exists() or cached_files(tmp_path / "cache") == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_of_another_format_in_a_directory_is_named_and_the_files_before_it_stay_cached(capsys, tmp_path, monkeypatch, workers):
    folder = tmp_path / "criteo"
    folder.mkdir()
    criteo_file(folder / "day_0", 400, 0)
    criteo_file(folder / "day_1", 300, 1)
    pq.write_table(pa.table({"x": [1, 2, 3]}), folder / "day_2.parquet")
    criteo_file(folder / "day_3", 200, 3)
    cache = tmp_path / "cache"
    line = one_line_error(capsys, *prepare_args(cache, folder, workers=workers))
    assert "day_2.parquet is a binary file, not delimited text; check --data and --data-format" in line
    assert {"day_0", "day_1"} <= set(cached_files(cache)) and "day_2.parquet" not in cached_files(cache)
    (folder / "day_2.parquet").unlink()
    parsed = []
    open_source = preparation.open_source
    monkeypatch.setattr(preparation, "open_source", lambda cfg, file=None, *a, **k: parsed.append(file.name) or open_source(cfg, file, *a, **k))
    assert read_manifest(prepare(DataConfig(path=str(folder), format="criteo", prepare_workers=1), cache, progress=False))["rows"] == 900
    assert set(parsed) <= {"day_3"}  # the earlier days were not parsed again


def test_a_truncated_gz_in_the_middle_names_the_file_and_the_line_reached(capsys, tmp_path):
    folder = tmp_path / "criteo"
    folder.mkdir()
    criteo_file(folder / "day_0", 500, 0)
    whole = criteo_file(folder / "day_1.gz", 12_000, 1, compress=True).read_bytes()
    (folder / "day_1.gz").write_bytes(whole[: len(whole) * 3 // 4])  # cut off, as by an interrupted copy
    criteo_file(folder / "day_2", 500, 2)
    cache = tmp_path / "cache"
    line = one_line_error(capsys, *prepare_args(cache, folder), "--set", "data.chunk_rows=1000")  # blocks of 1 MB: the first reads whole
    assert "cannot read" in line and "day_1.gz after line " in line and "Truncated" in line, line
    assert "day_0" in cached_files(cache) and "day_1.gz" not in cached_files(cache)


def test_a_malformed_row_in_strict_mode_names_the_file_and_line(capsys, tmp_path):
    day_0 = criteo_file(tmp_path / "day_0", 100, 0)
    day_1 = criteo_file(tmp_path / "day_1", 100, 1)
    lines = day_1.read_text().splitlines()
    lines[41] = "1\tx"
    day_1.write_text("\n".join(lines) + "\n")
    line = one_line_error(capsys, *prepare_args(tmp_path / "cache", day_0, day_1), "--strict")
    assert "day_1: line 42: 2 columns instead of 40" in line
    assert cached_files(tmp_path / "cache") == ["day_0"]


def test_a_killed_worker_is_one_error_not_a_hang(tmp_path, monkeypatch):
    import os
    import signal

    folder = tmp_path / "criteo"
    folder.mkdir()
    for day in range(3):
        criteo_file(folder / f"day_{day}", 100, day)
    prepare_part = preparation.prepare_part

    def killed_on_day_1(job, k, ledger, progress):
        if job.inputs[job.parts[k].input].name == "day_1":
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
        return prepare_part(job, k, ledger, progress)

    monkeypatch.setattr(preparation, "prepare_part", killed_on_day_1)
    with pytest.raises(DistrecError, match=r"the process preparing .*day_1 died \(exit status -9\)"):
        prepare(DataConfig(path=str(folder), format="criteo", prepare_workers=2), tmp_path / "cache", progress=False)
