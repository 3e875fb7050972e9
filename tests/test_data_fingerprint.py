"""A resume on changed data is refused with one line; paths are stored absolute."""

import json
import os
import shutil

import pytest
import yaml

from distrec.cli import main
from distrec.config import DataConfig, SyntheticConfig
from distrec.data.fingerprint import BLOCK_BYTES, DATA_FILE, SAMPLED_BLOCKS, check_same_data, fingerprint, resolve_paths
from distrec.errors import DistrecError


def refused(saved, current, *fragments):
    with pytest.raises(DistrecError, match="cannot resume on different data") as e:
        check_same_data(saved, current)
    for fragment in fragments:
        assert fragment in str(e.value)


def test_size_and_sampled_content_are_compared_mtime_is_not(tmp_path):
    data = tmp_path / "big.tsv"
    size = (SAMPLED_BLOCKS + 4) * BLOCK_BYTES  # larger than the sampled bytes: only blocks are hashed
    data.write_bytes(b"a" * size)
    cfg = DataConfig(path=str(data), format="criteo")
    saved = fingerprint(cfg)
    os.utime(data, ns=(1, 1))  # a touch or a plain copy keeps the rows
    check_same_data(saved, fingerprint(cfg))
    with open(data, "r+b") as f:  # same size, the last (always sampled) block edited
        f.seek(size - 10)
        f.write(b"b")
    refused(saved, fingerprint(cfg), "big.tsv changed since the run started (same size, different content)")
    data.write_bytes(b"a" * (size + 1))
    refused(saved, fingerprint(cfg), f"({size:,} bytes then, {size + 1:,} now)")


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"max_ind_range": 2000}, "data.max_ind_range was 1000 when the run started and is 2000 now"),
        ({"split": "random:0.2"}, "data.split was 'random:0.1'"),
        ({"table_sizes": {"C1": 10}}, "data.table_sizes was {}"),
        ({"format": "csv", "schema": "s.yaml"}, "data.format was 'criteo'"),
    ],
)
def test_changed_data_settings_are_refused(tmp_path, change, fragment):
    data = tmp_path / "d.tsv"
    data.write_text("x\n")
    (tmp_path / "s.yaml").write_text("label: x\ndense: [x]\n")
    saved = fingerprint(DataConfig(path=str(data), format="criteo", max_ind_range=1000))
    change = {k: str(tmp_path / v) if k == "schema" else v for k, v in change.items()}
    refused(saved, fingerprint(DataConfig(**{"path": str(data), "format": "criteo", "max_ind_range": 1000, **change})), fragment)


def test_synthetic_parameters_are_compared():
    saved = fingerprint(DataConfig(synthetic=SyntheticConfig(rows=100)))
    assert saved["files"] == []
    check_same_data(saved, fingerprint(DataConfig(synthetic=SyntheticConfig(rows=100))))
    refused(saved, fingerprint(DataConfig(synthetic=SyntheticConfig(rows=200))), "data.synthetic was")
    refused(saved, fingerprint(DataConfig(synthetic=SyntheticConfig(rows=100, fresh_each_epoch=False))), "data.synthetic was")


def test_a_synthetic_setting_added_since_a_run_started_takes_its_default():
    saved = fingerprint(DataConfig(synthetic=SyntheticConfig(rows=100)))
    del saved["settings"]["synthetic"]["fresh_each_epoch"]  # as a run of an earlier distrec saved it
    check_same_data(saved, fingerprint(DataConfig(synthetic=SyntheticConfig(rows=100))))
    refused(saved, fingerprint(DataConfig(synthetic=SyntheticConfig(rows=100, fresh_each_epoch=False))), "data.synthetic was")


def test_resolve_paths_makes_relative_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.tsv").write_text("x\n")
    cfg = DataConfig(path="d.tsv", format="criteo", schema="~/s.yaml", cache_dir=None)
    resolve_paths(cfg)
    assert cfg.path == str(tmp_path / "d.tsv") and cfg.schema == os.path.expanduser("~/s.yaml") and cfg.cache_dir is None


RUN = ["--preset", "tiny", "--data-format", "criteo", "--max-ind-range", "64", "--batch-size", "50", "--no-progress"]


def run(capsys, *argv):
    status = main([str(a) for a in argv])
    _, err = capsys.readouterr()
    return status, [line for line in err.splitlines() if line.strip()]


@pytest.fixture
def criteo_run(tmp_path, monkeypatch, shared_data, capsys):
    """A 2-step run on a copy of the 200-row Criteo sample, started with a relative --data."""
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))
    first = tmp_path / "first"
    first.mkdir()
    shutil.copy(shared_data / "criteo" / "criteo_kaggle_tiny.tsv", first / "d.tsv")
    monkeypatch.chdir(first)
    status, err = run(capsys, "train", *RUN, "--data", "d.tsv", "--max-steps", "2", "--out", tmp_path / "run")
    assert status == 0, err
    return tmp_path / "run"


def test_resume_refuses_changed_data_with_one_line(criteo_run, tmp_path, capsys, monkeypatch):
    run_dir = criteo_run
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    data = tmp_path / "first" / "d.tsv"
    assert config["data"]["path"] == str(data)  # stored absolute
    assert json.loads((run_dir / DATA_FILE).read_text())["files"][0]["path"] == str(data)

    # another working directory holding a different d.tsv: the run still reads its own file
    other = tmp_path / "other"
    other.mkdir()
    (other / "d.tsv").write_text(data.read_text()[: len(data.read_text()) // 2])
    monkeypatch.chdir(other)
    status, err = run(capsys, "train", "--resume", run_dir, "--max-steps", "3")
    assert status == 0, err

    # rows appended to the data file
    original = data.read_bytes()
    with open(data, "ab") as f:
        f.write(original)
    status, err = run(capsys, "train", "--resume", run_dir, "--max-steps", "4")
    assert status == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith(f"distrec: error: cannot resume on different data: {data} changed since the run started")
    data.write_bytes(original)

    # a relative data.path written into the run's config resolves elsewhere from this directory
    edited = dict(config, data=dict(config["data"], path="d.tsv"))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(edited))
    status, err = run(capsys, "train", "--resume", run_dir, "--max-steps", "4")
    assert status == 2 and err == [
        (
            f"distrec: error: cannot resume on different data: data.path was {str(data)!r} when the "
            f"run started and is {str(other / 'd.tsv')!r} now; restore it, or train a new run with --out"
        )
    ]

    # an edited max_ind_range rehashes every row
    edited = dict(config, data=dict(config["data"], max_ind_range=128))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(edited))
    status, err = run(capsys, "train", "--resume", run_dir, "--max-steps", "4")
    assert status == 2 and len(err) == 1 and "data.max_ind_range was 64 when the run started and is 128 now" in err[0]
