"""Serving: the pooled lookup in torch operators, fp16 and int8 row-wise tables, the exported
program (equal to the model, run without distrec), ``distrec predict`` and ``distrec export``
on a trained run, and their one-line errors that write nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from distrec.cli import main
from distrec.config import ModelConfig, SyntheticConfig, apply_preset
from distrec.data.synthetic import synthesize
from distrec.errors import DistrecError
from distrec.models.build import build_model
from distrec.models.embedding import EmbeddingBagCollection
from distrec.serving.inputs import JaggedInputs, example_inputs
from distrec.serving.lookup import ServingTables, use_serving_tables
from distrec.serving.onnx_format import save_onnx
from distrec.serving.program import ServingModel, export_program
from distrec.serving.quantize import quantize_rows
from distrec.serving.scores_file import ScoresWriter
from distrec.tables import TableConfig
from distrec.tower_partition import TowerPartition
from distrec.train.evaluate import evaluate_checkpoint
from distrec.train.loop import train
from test_cli import assert_one_line_error
from tiny_runs import tiny_config

TABLES = [TableConfig("a", 7, 8, True), TableConfig("b", 3, 8, True), TableConfig("c", 11, 8, True)]  # dim: the tiny preset's
TOWERS = [[0, 2], [1]]
# the tiny DLRM, a DCN of its size, and both with DMT tower modules
ARCHS = {
    "dlrm": {},
    "dcn": {"arch": "dcn", "cross_layers": 2, "deep_mlp": [16], "bottom_mlp": [16]},
    "dmt-dlrm": {"tower_module": "dlrm", "tower_compression": 2.0},
    "dmt-dcn": {"arch": "dcn", "cross_layers": 2, "deep_mlp": [16], "bottom_mlp": [16], "tower_module": "dcn", "tower_compression": 2.0},
}


def jagged(lengths: list[int], tables: list[TableConfig], num_dense: int = 3, seed: int = 0) -> JaggedInputs:
    """A batch of len(lengths) / F samples with these bag lengths (feature-major), random rows."""
    generator = torch.Generator().manual_seed(seed)
    batch_size = len(lengths) // len(tables)
    rows = [t.num_rows for t in tables for _ in range(batch_size)]
    values = [int(torch.randint(rows[k], (), generator=generator)) for k, n in enumerate(lengths) for _ in range(n)]
    return JaggedInputs(
        torch.randn(batch_size, num_dense, generator=generator), torch.tensor(values, dtype=torch.int64), torch.tensor(lengths, dtype=torch.int32)
    )


BATCHES = {
    "multi-hot with empty bags": [2, 0, 1, 3, 0, 1, 1, 2, 0],
    "single-hot": [1] * 9,
    "the last features empty": [1, 2, 1, 0, 0, 0, 0, 0, 0],
    "no rows at all": [0] * 9,
    "one sample": [2, 1, 3],
}


@pytest.mark.parametrize("lengths", BATCHES.values(), ids=BATCHES.keys())
def test_serving_tables_pool_as_the_embedding_bags(lengths):
    torch.manual_seed(0)
    bags = EmbeddingBagCollection(TABLES)
    batch = jagged(lengths, TABLES).batch()
    expected = bags(batch).detach()
    torch.testing.assert_close(ServingTables(bags, "fp32")(batch), expected, rtol=0, atol=1e-6)
    weight = bags.weight.detach()
    # fp16: each value within half a unit in the last place (2^-11 relative) of the float one
    torch.testing.assert_close(ServingTables(bags, "fp16")(batch), expected, rtol=0, atol=max(lengths) * float(weight.abs().max()) * 2**-11 + 1e-7)
    # int8: each value within half a step (its row's range / 255 / 2) of the float one
    half_step = float((weight.amax(1) - weight.amin(1)).max()) / 255 / 2
    torch.testing.assert_close(ServingTables(bags, "int8")(batch), expected, rtol=0, atol=max(lengths) * half_step + 1e-6)


def test_int8_rows_are_fbgemm_rowwise():
    weight = torch.tensor([[-1.0, 0.0, 0.5, 1.0], [2.0, 2.0, 2.0, 2.0], [0.0, 0.3, 0.1, 0.2]])
    stored = quantize_rows(weight, "int8")
    low, high = weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
    scale = (high - low) / 255
    assert stored["rows"].dtype == torch.uint8 and stored["scale_bias"].dtype == torch.float32
    torch.testing.assert_close(stored["scale_bias"], torch.cat([scale, low], 1))
    expected = torch.where(scale > 0, (weight - low) / torch.where(scale > 0, scale, 1), 0).round().to(torch.uint8)
    assert torch.equal(stored["rows"], expected)
    assert stored["rows"][0, [0, 3]].tolist() == [0, 255] and stored["rows"][1].tolist() == [0, 0, 0, 0]  # a constant row: scale 0
    restored = stored["rows"].float() * stored["scale_bias"][:, :1] + stored["scale_bias"][:, 1:]
    assert float((restored - weight).abs().max()) <= float(scale.max()) / 2 + 1e-7
    assert quantize_rows(weight, "fp16")["rows"].dtype == torch.float16


def tiny_model(arch: str, seed: int = 0):
    cfg = ModelConfig()
    apply_preset(cfg, "tiny")
    for key, value in ARCHS[arch].items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    return build_model(cfg, 3, TABLES, towers=TOWERS if cfg.tower_module else None).eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_the_exported_program_scores_as_the_model_at_any_batch_size(arch):
    model = tiny_model(arch)
    batches = [jagged(lengths, TABLES, seed=i) for i, lengths in enumerate(BATCHES.values())]
    with torch.no_grad():
        expected = [torch.sigmoid(model(b.batch())) for b in batches]
    use_serving_tables(model)
    program = export_program(model, 3, [t.num_rows for t in TABLES]).module()
    for inputs, scores in zip(batches, expected):
        torch.testing.assert_close(program(*inputs), scores, rtol=0, atol=1e-6)


# run with -I -S: no site-packages .pth file (distrec's editable install) is read, no cwd on the path
WITHOUT_DISTREC = """
import json, sys
sys.path.append({site!r})
try:
    import distrec
except ImportError:
    print("distrec is not importable", file=sys.stderr)
else:
    raise SystemExit("distrec is importable here")
import torch
program = torch.export.load({program!r}).module()
inputs = torch.load({inputs!r}, weights_only=True)
print(json.dumps(program(*inputs).tolist()))
"""


def run_without_distrec(program: Path, inputs: JaggedInputs, workdir: Path) -> list[float]:
    """The program's scores of ``inputs`` from a Python process in which distrec is not importable."""
    torch.save(tuple(inputs), workdir / "inputs.pt")
    site = str(Path(torch.__file__).parents[1])
    code = WITHOUT_DISTREC.format(site=site, program=str(program), inputs=str(workdir / "inputs.pt"))
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "distrec is not importable" in done.stderr
    return json.loads(done.stdout)


def test_the_program_runs_where_distrec_is_not_importable(tmp_path):
    model = tiny_model("dmt-dlrm")
    inputs = jagged(BATCHES["multi-hot with empty bags"], TABLES)
    with torch.no_grad():
        expected = torch.sigmoid(model(inputs.batch()))
    use_serving_tables(model, "int8")
    with open(tmp_path / "model.pt2", "wb") as f:
        torch.export.save(export_program(model, 3, [t.num_rows for t in TABLES]), f)
    scores = run_without_distrec(tmp_path / "model.pt2", inputs, tmp_path)
    assert scores == pytest.approx(expected.tolist(), abs=2e-3)


@pytest.mark.parametrize("name", ["scores.parquet", "scores.csv"])
def test_scores_appear_whole_or_not_at_all(tmp_path, name):
    path = tmp_path / name
    with ScoresWriter(path) as writer:
        writer.write(np.arange(2), np.array([0.25, 0.5], np.float32), np.array([0, 1], np.float32))
        writer.write(np.arange(2, 3), np.array([0.75], np.float32), np.array([1], np.float32))
    table = pq.read_table(path) if name.endswith(".parquet") else pacsv.read_csv(path)
    assert table.column_names == ["row", "score", "label"] and table.column("row").to_pylist() == [0, 1, 2]
    assert table.column("score").to_pylist() == [0.25, 0.5, 0.75]
    with pytest.raises(RuntimeError), ScoresWriter(path) as writer:
        writer.write(np.arange(1), np.array([0.0], np.float32), np.array([0], np.float32))
        raise RuntimeError("stopped midway")
    assert (pq.read_table(path) if name.endswith(".parquet") else pacsv.read_csv(path)).num_rows == 3  # the old file, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary left


def scores_of(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, score, label) columns of a scores file."""
    table = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
    return tuple(table.column(c).to_numpy().astype(np.float64 if c != "row" else np.int64) for c in ("row", "score", "label"))


def cli(capsys, *argv) -> dict:
    """The JSON line a ``distrec`` command printed (it must succeed), without progress bars."""
    assert main([*map(str, argv), *(["--no-progress"] if argv[0] == "predict" else [])]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def tiny_run(root: Path, arch: str = "dlrm", steps: int = 4) -> Path:
    """A run of ``arch`` trained ``steps`` steps on the tiny synthetic data (5 multi-hot features)."""
    towers = root / "towers.json"
    TowerPartition([["C1", "C3", "C5"], ["C2", "C4"]], "coherent", 1.5).save(towers)
    overrides = [f"model.{key}={json.dumps(value)}" for key, value in ARCHS[arch].items()]
    cfg = tiny_config(root / "cache", steps, tuple(overrides), **({"towers": str(towers)} if "dmt" in arch else {}))
    out = root / arch
    train(cfg, out, progress=False)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serving-runs")
    return {arch: tiny_run(root, arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_exported_scores_equal_predicts(runs, tmp_path, capsys, arch):
    run = runs[arch]
    checkpoint = cli(capsys, "predict", "--checkpoint", run, "-o", tmp_path / "checkpoint.parquet")
    exported = cli(capsys, "export", "--checkpoint", run, "-o", tmp_path / "model.pt2")
    assert exported["table_bytes"] == 5 * 97 * 8 * 4 and Path(exported["manifest"]).is_file()
    program = cli(capsys, "predict", "--model", tmp_path / "model.pt2", "-o", tmp_path / "program.csv")
    assert checkpoint["rows"] == program["rows"] == 1200 and checkpoint["malformed_rows"] == 0
    rows, scores, labels = scores_of(tmp_path / "checkpoint.parquet")
    assert rows.tolist() == list(range(1200))
    program_rows, program_scores, program_labels = scores_of(tmp_path / "program.csv")
    assert np.array_equal(program_rows, rows) and np.array_equal(program_labels, labels)
    assert np.abs(program_scores - scores).max() <= 1e-5
    evaluated = evaluate_checkpoint(run, None, None, split="all", progress=False)
    assert roc_auc_score(labels, scores) == pytest.approx(evaluated["auc"], abs=1e-6)


def test_the_json_says_how_to_feed_the_program(runs, tmp_path, capsys):
    cli(capsys, "export", "--checkpoint", runs["dmt-dcn"], "--table-dtype", "int8", "-o", tmp_path / "model.pt2")
    manifest = json.loads((tmp_path / "model.pt2.json").read_text())
    assert [i["name"] for i in manifest["inputs"]] == ["dense", "values", "lengths"]
    assert manifest["inputs"][0]["shape"] == ["B", 13] and manifest["inputs"][2]["shape"] == ["5*B"]
    assert [f["name"] for f in manifest["sparse_features"]] == ["C1", "C2", "C3", "C4", "C5"]
    assert {f["table_rows"] for f in manifest["sparse_features"]} == {97}
    assert manifest["tables"]["dtype"] == "int8" and manifest["tables"]["bytes"] == 5 * 97 * (8 + 8)
    assert manifest["model"]["towers"] == [["C1", "C3", "C5"], ["C2", "C4"]] and "raw == 0" in manifest["row_of_raw_id"]


def test_criteo_data_is_hashed_and_transformed_as_the_json_says(tmp_path, capsys):
    """A model trained on a Criteo TSV: the JSON's rules, applied to the raw text, give the
    program the inputs that make predict's scores."""
    data = synthesize(SyntheticConfig(rows=300, num_sparse=26, table_rows=1000, pooling_factor=1), tmp_path / "clicks.tsv", progress=False)
    cfg = tiny_config(tmp_path / "cache", 3, ('data.format="criteo"', f"data.path={json.dumps(str(data))}", "data.max_ind_range=101"))
    train(cfg, tmp_path / "run", progress=False)
    cli(capsys, "export", "--checkpoint", tmp_path / "run", "-o", tmp_path / "model.pt2")
    cli(capsys, "predict", "--model", tmp_path / "model.pt2", "--data", data, "--data-format", "criteo", "-o", tmp_path / "scores.parquet")
    manifest = json.loads((tmp_path / "model.pt2.json").read_text())
    assert [f["name"] for f in manifest["dense_features"]] == [f"I{i}" for i in range(1, 14)]
    assert "log(1 + max(x, 0))" in manifest["dense_features"][0]["transform"] and "hexadecimal" in manifest["sparse_features"][0]["raw_id"]
    # the first 4 lines, turned into inputs by hand from the rules the JSON states
    lines = [line.split("\t") for line in data.read_text().splitlines()[:4]]
    dense = torch.tensor([[np.log1p(max(int(x or 0), 0)) for x in line[1:14]] for line in lines], dtype=torch.float32)
    raw = [[int(h, 16) + 1 if h else 0 for h in line[14:]] for line in lines]
    rows = [[0 if r == 0 else 1 + (r - 1) % (f["table_rows"] - 1) for r, f in zip(sample, manifest["sparse_features"])] for sample in raw]
    values = torch.tensor(rows, dtype=torch.int64).t().reshape(-1)  # feature-major
    inputs = JaggedInputs(dense, values, torch.ones(26 * 4, dtype=torch.int32))
    _, scores, _ = scores_of(tmp_path / "scores.parquet")
    assert run_without_distrec(tmp_path / "model.pt2", inputs, tmp_path) == pytest.approx(scores[:4].tolist(), abs=1e-6)


def test_csv_dense_columns_are_transformed_as_fitted_on_the_training_rows_everywhere(tmp_path, capsys):
    """A model trained on a CSV: the transforms fitted on its training rows are in every
    checkpoint and in the JSON, and evaluate, predict and the program all feed the model them."""
    rng = np.random.default_rng(0)
    n = 600
    count, delta = rng.integers(0, 5000, n), rng.normal(300, 50, n).round(2) * rng.choice([-1, 1], n)
    label = (rng.random(n) < 1 / (1 + np.exp(-(np.log1p(count) - 6)))).astype(int)
    lines = ["y,count,delta,site"] + [f"{y},{c},{d},s{i % 7}" for y, c, d, i in zip(label, count, delta, range(n))]
    data = tmp_path / "clicks.csv"
    data.write_text("\n".join(lines) + "\n")
    schema = tmp_path / "schema.yaml"
    schema.write_text("label: y\ndense: [count, delta]\ncategorical: [site]\n")
    overrides = ('data.format="csv"', f"data.path={json.dumps(str(data))}", f"data.schema={json.dumps(str(schema))}", 'data.split="last:0.2"')
    cfg = tiny_config(tmp_path / "cache", 12, overrides)
    summary = train(cfg, tmp_path / "run", progress=False)
    fitted = json.loads((tmp_path / "run" / "checkpoint" / "meta.json").read_text())["dense_transforms"]
    assert [(f["name"], f["transform"]) for f in fitted] == [("count", "log1p"), ("delta", "standardize")]
    assert fitted[1]["mean"] == pytest.approx(delta[:480].mean()) and fitted[1]["std"] == pytest.approx(delta[:480].std())  # training rows only
    evaluated = evaluate_checkpoint(tmp_path / "run", None, None, progress=False)
    assert evaluated["logloss"] == pytest.approx(summary["logloss"], abs=1e-6)
    cli(capsys, "export", "--checkpoint", tmp_path / "run", "-o", tmp_path / "model.pt2")
    manifest = json.loads((tmp_path / "model.pt2.json").read_text())
    assert [f["fitted"] for f in manifest["dense_features"]] == fitted
    assert "log(1 + max(x, 0))" in manifest["dense_features"][0]["transform"] and repr(fitted[1]["mean"]) in manifest["dense_features"][1]["transform"]
    cli(capsys, "predict", "--checkpoint", tmp_path / "run", "-o", tmp_path / "checkpoint.parquet")
    cli(capsys, "predict", "--model", tmp_path / "model.pt2", "-o", tmp_path / "program.parquet")
    _, scores, labels = scores_of(tmp_path / "checkpoint.parquet")
    assert np.abs(scores_of(tmp_path / "program.parquet")[1] - scores).max() <= 1e-5
    val = np.arange(480, 600)
    assert log_loss(labels[val], scores[val]) == pytest.approx(summary["logloss"], abs=1e-5)


def test_bad_inputs_are_one_line_and_write_nothing(runs, tmp_path, capsys):
    run, before = runs["dlrm"], set(tmp_path.iterdir())
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    assert_one_line_error(capsys, ["predict", "--checkpoint", str(not_a_run), "-o", str(tmp_path / "s.parquet")], "holds no checkpoint")
    assert_one_line_error(capsys, ["export", "--checkpoint", str(not_a_run), "-o", str(tmp_path / "m.pt2")], "holds no checkpoint")
    assert_one_line_error(capsys, ["predict", "--checkpoint", str(run), "-o", str(tmp_path / "s.txt")], ".parquet or .csv")
    exists = tmp_path / "taken.pt2"
    exists.write_text("mine")
    assert_one_line_error(capsys, ["export", "--checkpoint", str(run), "-o", str(exists)], "exists", "another -o")
    # a file that is not an exported program: without the JSON, and with one copied beside it
    assert_one_line_error(capsys, ["predict", "--model", str(exists), "-o", str(tmp_path / "s.parquet")], "taken.pt2.json")
    cli(capsys, "export", "--checkpoint", run, "-o", tmp_path / "real.pt2")
    (tmp_path / "taken.pt2.json").write_text((tmp_path / "real.pt2.json").read_text())
    assert_one_line_error(capsys, ["predict", "--model", str(exists), "-o", str(tmp_path / "s.parquet")], "is not a torch.export program")
    (tmp_path / "taken.pt2.json").write_text("{}")
    assert_one_line_error(capsys, ["predict", "--model", str(exists), "-o", str(tmp_path / "s.parquet")], "does not describe an exported model")
    (tmp_path / "taken.pt2.json").write_text('{"kind": "distrec-export", "version": 1}')
    assert_one_line_error(capsys, ["predict", "--model", str(exists), "-o", str(tmp_path / "s.parquet")], "lacks 'tables'", "export the model again")
    # data of other features: a Criteo file (26 features) for a model of 5
    criteo = synthesize(SyntheticConfig(rows=20, num_sparse=26, pooling_factor=1), tmp_path / "other.tsv", progress=False)
    for model in (["--checkpoint", str(run)], ["--model", str(tmp_path / "real.pt2")]):
        line = assert_one_line_error(capsys, ["predict", *model, "--data", str(criteo), "--data-format", "criteo", "-o", str(tmp_path / "s.parquet")])
        assert "different features than the model: 13 dense and [C1, C2, C3, C4, C5, C6, ... (20 more)], the model's 13 and [C1, C2, C3, C4, C5]" in line
    assert {p.name for p in set(tmp_path.iterdir()) - before} == {"empty", "taken.pt2", "taken.pt2.json", "real.pt2", "real.pt2.json", "other.tsv"}
    assert exists.read_text() == "mine"


def test_onnx_export_is_checked_by_onnxruntime(tmp_path):
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    for arch in ARCHS:
        model = tiny_model(arch)
        use_serving_tables(model, "int8")
        program = export_program(model, 3, [t.num_rows for t in TABLES])
        assert save_onnx(program, tmp_path / f"{arch}.onnx", example_inputs(3, [t.num_rows for t in TABLES], batch_size=16))


class Searching(torch.nn.Module):
    """A model with an operator torch's ONNX exporter does not translate."""

    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(torch.tensor([0.0, 1.0]), dense[:, 0]).float()


def test_an_operator_onnx_lacks_is_named(tmp_path):
    pytest.importorskip("onnxscript")
    inputs = example_inputs(1, [3])
    program = torch.export.export(Searching(), tuple(inputs))
    with pytest.raises(DistrecError, match=r"^the ONNX exporter cannot translate this model: it has no translation of the operator aten\.searchsorted"):
        save_onnx(program, tmp_path / "m.onnx", inputs)


def test_the_program_is_the_serving_model():
    """ServingModel scores any model alike, with the kernels' lookup or the torch operators'."""
    model = tiny_model("dlrm")
    inputs = jagged(BATCHES["multi-hot with empty bags"], TABLES)
    kernels = ServingModel(model)(*inputs)
    use_serving_tables(model)
    torch.testing.assert_close(ServingModel(model)(*inputs), kernels, rtol=0, atol=1e-6)
