"""The command line as users meet it: help with examples, data commands, evaluate, and every
user-facing error as exit 2 with one line on stderr and no traceback."""

import argparse
import json

import pytest

from distrec import __version__
from distrec.cli import build_parser, main

# a tiny synthetic Criteo-shaped data set: small tables so a run takes a second
TINY_DATA = ["--set", "data.synthetic.rows=600", "--set", "data.synthetic.table_rows=50"]
TINY_RUN = ["--preset", "tiny", *TINY_DATA, "--batch-size", "64", "--max-steps", "4", "--no-progress"]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr) of ``distrec argv``."""
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


ANNOUNCED_RUN = "distrec: writing the run to "  # what a new run says before it starts
ANNOUNCED_OPTIMIZERS = "distrec: optimizers "  # what a new run without chosen optimizers says first


def assert_one_line_error(capsys, argv, *fragments):
    """Check that ``distrec argv`` fails with one line holding every fragment; that line."""
    status, _, err = run_cli(capsys, *argv)
    assert status == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("WARNING", ANNOUNCED_RUN, ANNOUNCED_OPTIMIZERS))]
    assert len(lines) == 1 and lines[0].startswith("distrec: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def all_parsers(parser=None, path=()):
    """(command path, parser) of every command and subcommand."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from all_parsers(sub, (*path, name))


@pytest.fixture(scope="module")
def synthetic_tsv(tmp_path_factory):
    """A Criteo-format TSV written by ``distrec data synth`` (600 rows)."""
    path = tmp_path_factory.mktemp("synth") / "synthetic.tsv"
    assert main(["data", "synth", "-o", str(path), "--rows", "600", "--set", "data.synthetic.table_rows=50", "--no-progress"]) == 0
    return path


@pytest.fixture(scope="module")
def criteo_run(tmp_path_factory, synthetic_tsv):
    """A run directory trained on ``synthetic_tsv`` read as Criteo."""
    out = tmp_path_factory.mktemp("run") / "run"
    cache = tmp_path_factory.mktemp("cache")
    argv = [
        "train",
        "--preset",
        "tiny",
        "--data-format",
        "criteo",
        "--data",
        str(synthetic_tsv),
        "--cache-dir",
        str(cache),
        "--max-ind-range",
        "64",
        "--batch-size",
        "64",
        "--max-steps",
        "6",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return out


def test_every_command_has_help_with_examples(capsys):
    commands = list(all_parsers())
    assert {("train",), ("evaluate",), ("data",), ("data", "prepare"), ("data", "synth")} <= {c for c, _ in commands}
    for command, _ in commands:
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert "examples:" in out and f"distrec {' '.join(command)}" in out, command


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"distrec {__version__}"


def test_train_writes_the_run_directory(capsys, tmp_path):
    out = tmp_path / "run"
    status, stdout, _ = run_cli(capsys, "train", *TINY_RUN, "--eval-every", "2", "--out", out)
    assert status == 0
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert {"auc", "logloss", "accuracy", "steps", "samples_per_s"} <= set(summary) and summary["steps"] == 4
    assert summary == json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4] and all({"auc", "logloss", "accuracy", "ne"} <= set(r) for r in records)
    assert "preset: tiny" in (out / "config.yaml").read_text()
    assert (out / "checkpoint" / "meta.json").is_file()


def test_data_synth_then_prepare_reports_rows(capsys, tmp_path, synthetic_tsv):
    status, stdout, _ = run_cli(capsys, "data", "prepare", "--data-format", "criteo", "--data", synthetic_tsv, "--cache-dir", tmp_path / "c", "--no-progress")
    assert status == 0
    result = json.loads(stdout)
    assert result["rows"] == 600 and result["malformed_rows"] == 0
    assert (tmp_path / "c").is_dir() and str(tmp_path / "c") in result["cache"]


def test_data_prepare_counts_and_locates_bad_rows(capsys, tmp_path, synthetic_tsv):
    lines = synthetic_tsv.read_text().splitlines()
    lines[2] = "1\t2\t3"  # wrong column count on line 3
    lines[4] = "\t".join(["0", "x", *lines[4].split("\t")[2:]])  # non-numeric integer field on line 5
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(lines) + "\n")
    status, stdout, _ = run_cli(capsys, "data", "prepare", "--data-format", "criteo", "--data", bad, "--no-progress")
    assert status == 0
    result = json.loads(stdout)
    assert (result["rows"], result["malformed_rows"], result["malformed_lines"]) == (598, 2, [3, 5])
    assert_one_line_error(capsys, ["data", "prepare", "--data-format", "criteo", "--data", bad, "--strict", "--no-progress"], "line 3", "--strict")


def test_evaluate_prints_one_json_object(capsys, criteo_run, synthetic_tsv):
    status, stdout, _ = run_cli(capsys, "evaluate", "--checkpoint", criteo_run, "--data", synthetic_tsv, "--data-format", "criteo", "--no-progress")
    assert status == 0
    result = json.loads(stdout)
    assert {"auc", "logloss", "accuracy", "rows"} <= set(result) and result["rows"] == 600
    assert 0 <= result["auc"] <= 1 and 0 <= result["accuracy"] <= 1


def test_train_on_csv_and_evaluate_on_parquet_with_a_schema(capsys, tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n = 400
    table = pa.table(
        {
            "user": [f"u{i}" for i in rng.integers(0, 30, n)],
            "tags": ["|".join(f"t{t}" for t in rng.choice(8, rng.integers(0, 4), replace=False)) for _ in range(n)],
            "age": rng.integers(18, 70, n),
            "rating": rng.integers(1, 6, n),
        }
    )
    pacsv.write_csv(table, tmp_path / "ratings.csv")
    pq.write_table(table, tmp_path / "ratings.parquet")
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: rating\nthreshold: 4\ndense: [age]\ncategorical: [user, {name: tags, separator: '|'}]\n")
    run = tmp_path / "run"
    status, stdout, _ = run_cli(
        capsys,
        "train",
        "--preset",
        "tiny",
        "--data-format",
        "csv",
        "--data",
        tmp_path / "ratings.csv",
        "--schema",
        schema,
        "--batch-size",
        "32",
        "--max-steps",
        "3",
        "--out",
        run,
        "--no-progress",
    )
    assert status == 0 and json.loads(stdout)["train_rows"] == 360
    status, stdout, _ = run_cli(
        capsys, "evaluate", "--checkpoint", run, "--data", tmp_path / "ratings.parquet", "--data-format", "parquet", "--schema", schema, "--no-progress"
    )
    assert status == 0 and json.loads(stdout)["rows"] == n


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["train", "--data-format", "criteo", "--data", "no/such.tsv"], ["'no/such.tsv' not found", "--data"]),
        (["train", "--preset", "nope"], ["unknown preset 'nope'", "dlrm-kaggle"]),
        (["train", "--set", "model.nope=3"], ["unknown config key 'model.nope'"]),
        (["train", "--set", "train.lr=fast"], ["train.lr", "'fast'"]),
        (["train", "--set", "train.batch_size=0"], ["train.batch_size is 0"]),
        (["train", "--set", "data.format=tsv"], ["data.format is 'tsv'; choose one of: synthetic, criteo, movielens, csv, parquet"]),
        (["train", "--set", "nonsense"], ["section.key=value"]),
        (["train", "--lr", "-1"], ["train.lr is -1"]),
        (["train", "--config", "no/such.yaml"], ["config file 'no/such.yaml' not found"]),
        (["train", "--data", "x.tsv"], ["--data needs --data-format"]),
        (["train", "--data-format", "criteo"], ["--data-format criteo needs --data PATH"]),
        (["train", "--data-format", "csv", "--data", "x.csv"], ["needs --schema"]),
        (["train", "--split", "half"], ["split 'half'", "random:0.1"]),
        (["train", "--split", "last:1.5"], ["split 'last:1.5'", "fractions"]),
        (["train", "--data-format", "movielens", "--data", "no/such/dir"], ["directory 'no/such/dir' not found"]),
        (["data", "prepare", "--data-format", "criteo", "--data", "no/such.tsv"], ["'no/such.tsv' not found"]),
        (["data", "synth", "-o", "x.tsv", "--set", "data.synthetic.num_dense=3"], ["13 dense", "num_dense=13"]),
        (["evaluate", "--checkpoint", "no/such/run"], ["checkpoint 'no/such/run' not found"]),
        (["train", "--set", "data.synthetic.zipf_exponents=[1.0, 2.0]"], ["26 non-negative Zipf exponents"]),
    ],
)
def test_user_errors_are_one_line(capsys, tmp_path, monkeypatch, argv, fragments):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(capsys, [*argv, "--no-progress"], *fragments)


def test_empty_and_all_malformed_data_sets(capsys, tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    assert_one_line_error(capsys, ["train", "--data-format", "criteo", "--data", empty, "--no-progress"], "no valid rows")
    junk = tmp_path / "junk.tsv"
    junk.write_text("a\tb\nc\n")
    assert_one_line_error(capsys, ["train", "--data-format", "criteo", "--data", junk, "--no-progress"], "no valid rows", "skipped 2 malformed row(s)")


def test_data_format_from_the_config_file(capsys, tmp_path, synthetic_tsv):
    config = tmp_path / "criteo.yaml"
    config.write_text("data:\n  format: criteo\nmodel:\n  preset: tiny\n")
    status, stdout, _ = run_cli(
        capsys,
        "train",
        "--config",
        config,
        "--data",
        synthetic_tsv,
        "--max-ind-range",
        "64",
        "--batch-size",
        "64",
        "--max-steps",
        "2",
        "--out",
        tmp_path / "run",
        "--no-progress",
    )
    assert status == 0 and json.loads(stdout)["train_rows"] == 540


def test_bad_config_files(capsys, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [1, 2\n")
    assert_one_line_error(capsys, ["train", "--config", broken], "not valid YAML")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("train:\n  optimizer: lbfgs\n")
    assert_one_line_error(capsys, ["train", "--config", wrong], "train.optimizer is 'lbfgs'")


def test_resume_errors(capsys, tmp_path, criteo_run):
    not_a_run = tmp_path / "not_a_run"
    not_a_run.mkdir()
    assert_one_line_error(capsys, ["train", "--resume", not_a_run, "--max-steps", "10", "--no-progress"], "cannot resume", "--out directory")
    assert_one_line_error(capsys, ["train", "--resume", criteo_run, "--lr", "0.5", "--no-progress"], "--lr cannot change a resumed run")
    # every config flag but those RESUMABLE names is refused, not silently ignored
    assert_one_line_error(capsys, ["train", "--resume", criteo_run, "--hotline", "--no-progress"], "--hotline cannot change a resumed run")


def test_evaluate_errors(capsys, tmp_path, criteo_run, shared_data):
    assert_one_line_error(capsys, ["evaluate", "--checkpoint", tmp_path, "--data", "x", "--data-format", "criteo"], "holds no checkpoint")
    assert_one_line_error(
        capsys,
        ["evaluate", "--checkpoint", criteo_run, "--data", shared_data / "movielens", "--data-format", "movielens", "--no-progress"],
        "different features",
    )


def test_train_with_tower_modules_prints_the_dmt_costs(capsys, tmp_path):
    status, stdout, stderr = run_cli(
        capsys,
        "train",
        *TINY_RUN,
        "--tower-module",
        "dlrm",
        "--compression",
        "2",
        "--tower-p",
        "2",
        "--hosts",
        "2",
        "--ranks-per-host",
        "1",
        "--out",
        tmp_path / "run",
    )
    assert status == 0
    (last,) = stdout.strip().splitlines()  # the JSON line alone
    line = next(line for line in stderr.splitlines() if line.startswith("DMT ("))
    cost = json.loads(last)["dmt"]
    assert line.startswith("DMT (dlrm towers") and f"{cost['compression']:.2f}x" in line
    assert cost["baseline_dense_parameters"] < cost["dense_parameters"]
    assert_one_line_error(capsys, ["train", *TINY_RUN, "--tower-module", "dlrm"], "--towers FILE")
    assert_one_line_error(capsys, ["train", "--resume", tmp_path / "run", "--tower-module", "dcn"], "--tower-module cannot change")
