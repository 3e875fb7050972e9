"""Config loading: defaults, presets, overrides, and one-line errors for bad values."""

from __future__ import annotations

import pytest

from distrec import config
from distrec.errors import DistrecError
from distrec.units import parse_bytes


def test_defaults_are_the_kaggle_dlrm():
    cfg = config.load()
    assert cfg.model.preset == "dlrm-kaggle"
    assert (cfg.model.embedding_dim, cfg.model.bottom_mlp, cfg.model.top_mlp) == (16, [512, 256, 64], [512, 256])


def test_preset_then_overrides(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("model:\n  preset: dlrm-terabyte\n  embedding_dim: 32\ntrain:\n  lr: 0.5\n")
    cfg = config.load(f, ["train.batch_size=64", "model.top_mlp=[8, 4]"])
    assert cfg.model.embedding_dim == 32  # explicit field beats the preset
    assert cfg.model.bottom_mlp == [512, 256]  # from the preset
    assert cfg.model.top_mlp == [8, 4]
    assert (cfg.train.lr, cfg.train.batch_size) == (0.5, 64)


@pytest.mark.parametrize("model", ["model:\n  preset: dlrm-mlperf\n", "model:\n  embedding_dim: -3\n"])
def test_a_command_line_preset_is_refused_with_a_file_that_sets_the_architecture(tmp_path, model):
    f = tmp_path / "exp.yaml"
    f.write_text(f"train:\n  lr: 0.5\n{model}")
    with pytest.raises(DistrecError, match=f"--preset tiny replaces the architecture that config file '{f}' sets in its model: section; drop --preset"):
        config.load(f, preset="tiny")
    f.write_text("train:\n  lr: 0.5\nmodel:\n")
    assert config.load(f, preset="tiny").model.embedding_dim == 8  # no architecture in the file: the preset's


def test_round_trip_through_yaml(tmp_path):
    cfg = config.load(None, ["train.max_steps=10", "data.table_sizes={C1: 50}"], preset="dcn")
    config.save(cfg, tmp_path / "config.yaml")
    again = config.load(tmp_path / "config.yaml")
    assert config.to_dict(again) == config.to_dict(cfg)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.lr=-1"], "train.lr is -1.0; it must be positive"),
        (["train.batch_size=0"], "train.batch_size is 0; it must be at least 1"),
        (["train.optimizer=lbfgs"], "train.optimizer is 'lbfgs'; choose one of"),
        (["train.batch_size=abc"], "config key 'train.batch_size' expects int"),
        (["train.nope=1"], "unknown config key 'train.nope'"),
        (["model.top_mlp=[0]"], "every layer width must be at least 1"),
        (["data.table_sizes={C1: 1}"], "a table needs at least 2 rows"),
        (["parallel.memory_per_rank=lots"], "is not a size"),
        (["train.embedding_weight_decay=-0.1"], "train.embedding_weight_decay is -0.1; it must be 0 or more"),
        (["hotline.enabled=true", "train.weight_decay=0.01"], "not supported with --hotline yet; set them to 0"),
        (["lr"], "must look like section.key=value"),
        # regression: NaN and infinite floats passed validation (NaN <= 0 is false)
        (["train.lr=.nan"], "train.lr is nan; it must be a finite number"),
        (["train.lr=inf"], "train.lr is inf; it must be a finite number"),
        (["train.embedding_lr=-.inf"], "train.embedding_lr is -inf; it must be a finite number"),
        (["train.weight_decay=NaN"], "train.weight_decay is nan; it must be a finite number"),
        (["data.synthetic.zipf_exponents=[1.0, .inf]"], "data.synthetic.zipf_exponents is inf; it must be a finite number"),
        (["model.tower_compression=.nan"], "model.tower_compression is nan; it must be a finite number"),
        (["model.tower_interaction=true"], "model.tower_interaction feeds the DLRM tower module's mixed outputs; add --tower-module dlrm"),
        (["model.tower_interaction=true", "model.tower_module=dcn", "parallel.hosts=2", "parallel.ranks_per_host=1"], "add --tower-module dlrm, or drop it"),
    ],
)
def test_bad_values_are_one_line_errors(overrides, message):
    with pytest.raises(DistrecError, match=message.replace("(", r"\(").replace("[", r"\[")) as e:
        config.load(None, overrides)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "section, key, value, message",
    [
        ("data", "format", "tsv", "data.format is 'tsv'; choose one of: synthetic, criteo, movielens, csv, parquet"),
        ("parallel", "sharding", "diagonal", "parallel.sharding is 'diagonal'; choose one of: table_wise, column_wise, row_wise, data_parallel"),
        ("model", "tower_module", "mlp", "model.tower_module is 'mlp'; choose one of: dlrm, dcn"),
        ("train", "decay", "exp", "train.decay is 'exp'; choose one of: none, linear, cosine, poly"),
        ("hotline", "slow_tier", 3, "hotline.slow_tier is 3; choose one of: auto, disk, host"),
    ],
)
def test_a_value_its_literal_type_does_not_list_is_a_one_line_error(tmp_path, section, key, value, message):
    f = tmp_path / "exp.yaml"
    f.write_text(f"{section}:\n  {key}: {value}\n")
    for source in ({"path": f}, {"overrides": [f"{section}.{key}={value}"]}):
        with pytest.raises(DistrecError) as e:
            config.load(**source)
        assert str(e.value) == message


def test_an_optional_choice_may_be_unset_and_validate_checks_choices_set_in_code():
    cfg = config.load(None, ["model.tower_module=null", "parallel.sharding=none"])
    assert (cfg.model.tower_module, cfg.parallel.sharding) == (None, None)
    cfg.parallel.lookup = "ring"
    with pytest.raises(DistrecError, match="parallel.lookup is 'ring'; choose one of: flat, sptt"):
        config.validate(cfg)


def test_unknown_preset_and_missing_file(tmp_path):
    with pytest.raises(DistrecError, match="unknown preset 'huge'; choose one of: dlrm-kaggle"):
        config.load(preset="huge")
    with pytest.raises(DistrecError, match="not found"):
        config.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(DistrecError, match="not valid YAML"):
        config.load(bad)


def test_non_utf8_config_file_is_one_line(tmp_path):
    # regression: a latin-1 or binary config file raised UnicodeDecodeError from config.load
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("train:\n  lr: 0.1  # r\xe9glage\n".encode("latin-1"))
    with pytest.raises(DistrecError, match=r"latin1\.yaml' is not UTF-8 text \(byte 0xe9 at offset 21\); save it as UTF-8"):
        config.load(bad)


@pytest.mark.parametrize("flag", ["nan", "-inf", "Infinity"])
def test_lr_flag_must_be_finite(tmp_path, flag):
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "distrec", "train", "--max-steps", "1", f"--lr={flag}", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2 and run.stderr.startswith("distrec: error: train.lr is ")
    assert run.stderr.rstrip().endswith("it must be a finite number") and run.stderr.count("\n") == 1


def test_parse_bytes():
    assert parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1.5GiB") == int(1.5 * 2**30)
    assert parse_bytes("4096") == 4096
    with pytest.raises(DistrecError):
        parse_bytes("12 parsecs")


def test_a_yes_or_no_is_not_a_number():
    with pytest.raises(DistrecError, match="train.max_steps' expects int, got True"):
        config.load(None, ["train.max_steps=true"])
