"""Many files on the command line: prepare a directory, train holding out the last file, and
evaluate a model on a given set of files."""

import json

import pytest

from distrec.cli import main


def run_cli(capsys, *argv):
    """(exit status, the JSON of stdout's last line) of ``distrec argv``."""
    status = main([str(a) for a in argv])
    out = capsys.readouterr().out
    return status, json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Three Criteo days of 400 rows written by ``distrec data synth`` (different seeds)."""
    folder = tmp_path_factory.mktemp("criteo")
    for day in range(3):
        argv = ["data", "synth", "-o", folder / f"day_{day}.tsv", "--rows", 400, "--seed", day, "--set", "data.synthetic.table_rows=50", "--no-progress"]
        assert main([str(a) for a in argv]) == 0
    return folder


def test_prepare_a_directory_reports_its_files_and_rows(capsys, tmp_path, days):
    status, result = run_cli(capsys, "data", "prepare", "--data-format", "criteo", "--data", days, "--cache-dir", tmp_path / "cache", "--no-progress")
    assert status == 0 and result["files"] == 3 and result["rows"] == 1200 and result["malformed_rows"] == 0 and result["seconds"] > 0
    status, again = run_cli(
        capsys, "data", "prepare", "--data-format", "criteo", "--data", days / "day_0.tsv", days / "day_2.tsv", "--cache-dir", tmp_path / "cache"
    )
    assert status == 0 and again["files"] == 2 and again["rows"] == 800


def test_train_holding_out_the_last_file_then_evaluate_given_files(capsys, tmp_path, days):
    run = tmp_path / "run"
    common = ["--data-format", "criteo", "--cache-dir", tmp_path / "cache", "--no-progress"]
    argv = ["train", "--preset", "tiny", "--data", days, *common, "--split", "files:1", "--max-ind-range", "64", "--batch-size", "64", "--max-steps", "3"]
    status, summary = run_cli(capsys, *argv, "--out", run)
    assert status == 0 and summary["train_rows"] == 800 and summary["test"]["rows"] == 400
    status, test = run_cli(capsys, "evaluate", "--checkpoint", run, "--split", "test", "--no-progress")
    assert status == 0 and test["scored"] == "the run's test split" and test["auc"] == pytest.approx(summary["test"]["auc"])
    status, given = run_cli(capsys, "evaluate", "--checkpoint", run, "--data", days / "day_1.tsv", days / "day_2.tsv", *common)
    assert status == 0 and given["rows"] == 800 and given["scored"].startswith("all rows of 2 paths (") and given["scored"].endswith("day_2.tsv)")
    status, last = run_cli(capsys, "evaluate", "--checkpoint", run, "--data", days / "day_2.tsv", *common)
    assert status == 0 and last["rows"] == 400 and last["auc"] == pytest.approx(summary["test"]["auc"])
