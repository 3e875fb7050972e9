"""Cost-model training on a small synthetic data set, saving, loading and the data reader."""

import json

import numpy as np
import pytest
import torch

from distrec.errors import DistrecError
from distrec.planner.cost_models import ENSEMBLE_SIZE, CommCostNet, ComputeCostNet, ComputeEnsemble, CostModels, comm_inputs, train_cost_models
from distrec.planner.features import TABLE_FEATURE_NAMES, feature_matrix
from distrec.planner.table_pool import make_table_pool
from distrec.planner.types import TableSpec

HARDWARE = {"kind": "hardware", "torch": "x", "cpu": "test cpu", "device_type": "cpu", "device_name": "test cpu", "world_sizes": [2]}


def write_synthetic_costs(path, compute_samples=200, comm_samples=200, seed=0):
    """Cost records shaped like `distrec plan collect` output, with known cost formulas."""
    rng = np.random.default_rng(seed)
    pool = make_table_pool(seed=0)
    lines = [HARDWARE]
    for i in range(compute_samples):
        ids = rng.integers(len(pool), size=int(rng.integers(1, 9)))
        tables = [pool.table(int(p), int(rng.choice([4, 8, 16, 32, 64])), f"s{i}_{k}") for k, p in enumerate(ids)]
        ms = sum(0.002 * t.dim * t.pooling_factor + 0.3 for t in tables) + rng.normal(0, 0.05)
        lines.append({"kind": "compute", "id": f"compute-{i}", "batch_size": 256, "tables": [t.to_dict() for t in tables], "ms": ms})
    for i in range(comm_samples):
        dims = rng.integers(0, 600, size=2)
        delays = rng.uniform(0, 20, size=2)
        delays -= delays.min()
        bw = np.maximum(0.004 * dims.sum() + rng.normal(0, 0.05, size=2), 0.0)  # measured times are never negative
        fw = bw + delays.max() - delays
        lines.append(
            {
                "kind": "comm",
                "id": f"comm2-{i}",
                "world_size": 2,
                "batch_size": 256,
                "dim_sums": dims.tolist(),
                "delays_ms": delays.tolist(),
                "fw_ms": fw.tolist(),
                "bw_ms": bw.tolist(),
            }
        )
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_training_reduces_validation_error_and_round_trips(tmp_path, capsys):
    data = write_synthetic_costs(tmp_path / "costs.jsonl")
    models = train_cost_models(data, tmp_path / "models.pt", seed=0, epochs=80)
    assert "test MSE" in capsys.readouterr().out
    for name in ("compute", "fw_comm_2", "bw_comm_2"):
        m = models.metrics[name]
        assert m["val_mse"] < 0.2 * m["initial_val_mse"], name
    loaded = CostModels.load(tmp_path / "models.pt")
    assert loaded.hardware["cpu"] == "test cpu" and loaded.hardware["world_sizes"] == [2] and loaded.batch_size == 256
    pool = make_table_pool(seed=0)
    narrow = [pool.table(i, 4, f"t{i}") for i in range(5)]
    wide = [t.with_dim(64) for t in narrow]
    a = models.predictor(2).placement_costs([narrow, wide])
    b = loaded.predictor(2).placement_costs([narrow, wide])
    assert all(np.allclose(a[k], b[k]) for k in a)
    assert b["compute"][1] > b["compute"][0]  # 16x the columns to look up


def test_forward_comm_model_learns_the_start_delays(tmp_path):
    data = write_synthetic_costs(tmp_path / "costs.jsonl", compute_samples=20)
    predictor = train_cost_models(data, seed=0, epochs=80, verbose=False).predictor(2)
    costs = predictor.plan_costs(np.array([0.0, 15.0]), np.array([300, 300]))  # device 1 starts 15 ms late
    assert costs["fw_comm"][0] - costs["fw_comm"][1] == pytest.approx(15.0, abs=3.0)
    assert costs["bw_comm"] == pytest.approx([2.4, 2.4], abs=0.5)  # 0.004 ms per column


def test_comm_models_treat_devices_alike():
    torch.manual_seed(0)
    fw, bw = CommCostNet.forward_model(), CommCostNet.backward_model()
    dims, delays = np.array([[40.0, 300.0, 120.0, 8.0, 64.0]]), np.array([[3.0, 0.0, 11.0, 5.0, 2.0]])
    for net, inputs in ((fw, comm_inputs(dims, delays)), (bw, comm_inputs(dims))):
        net.set_statistics(torch.from_numpy(inputs[0]).float(), torch.ones(1))
    predictor = CostModels(ComputeEnsemble([ComputeCostNet()]), {5: (fw, bw)}, 256, {}).predictor(5)
    costs = predictor.plan_costs(np.array([1.0, 9.0, 4.0, 0.0, 2.0]), dims[0])
    with torch.no_grad():
        assert costs["bw_comm"] == pytest.approx(bw(torch.from_numpy(comm_inputs(dims)).float())[0].numpy(), rel=1e-5)
    order = np.array([3, 0, 4, 1, 2])
    permuted = predictor.plan_costs(np.array([1.0, 9.0, 4.0, 0.0, 2.0])[order], dims[0][order])
    assert np.ptp(costs["bw_comm"]) > 0  # devices with other dims cost differently...
    for part in ("bw_comm", "fw_comm", "total"):  # ...and a device's cost does not depend on its number
        assert permuted[part] == pytest.approx(costs[part][order])


def test_wrong_format_and_mixed_hardware_are_user_errors(tmp_path):
    bad = tmp_path / "bad.pt"
    torch.save({"format": 0}, bad)
    with pytest.raises(DistrecError, match="retrain"):
        CostModels.load(bad)
    with pytest.raises(DistrecError, match="not found"):
        CostModels.load(tmp_path / "missing.pt")
    a = write_synthetic_costs(tmp_path / "a.jsonl", 20, 20)
    b = tmp_path / "b.jsonl"
    b.write_text(a.read_text().replace("test cpu", "other cpu"))
    with pytest.raises(DistrecError, match="one machine"):
        train_cost_models([a, b], verbose=False)
    (tmp_path / "junk.jsonl").write_text("not json\n")
    with pytest.raises(DistrecError, match="line 1"):
        train_cost_models(tmp_path / "junk.jsonl", verbose=False)


def test_inputs_beyond_the_training_range_predict_as_at_its_edge(tmp_path):
    models = train_cost_models(write_synthetic_costs(tmp_path / "costs.jsonl", 60, 30), seed=0, epochs=5, verbose=False)
    predictor = models.predictor(2)
    column = TABLE_FEATURE_NAMES.index("pooling_factor")
    edge = float(models.compute.members[0].input_high[column])
    table = make_table_pool(seed=0).table(0, 64, "t")  # the widest dim: its lookup floats (dim x pooling) pass their edge too
    at_edge, beyond = (TableSpec(t.name, t.num_rows, t.dim, p, t.histogram) for t, p in ((table, edge), (table, 100 * edge)))
    assert predictor.embed([beyond]) == pytest.approx(predictor.embed([at_edge]))
    features = torch.from_numpy(feature_matrix([at_edge, beyond]))
    torch_ms = models.compute(features, torch.tensor([0, 1]), 2).detach().numpy()
    assert torch_ms[0] == pytest.approx(torch_ms[1]) and torch_ms[0] == pytest.approx(predictor.device_compute(predictor.embed([at_edge]))[0], rel=1e-5)
    high_dims = predictor.plan_costs(np.zeros(2), np.array([600.0, 600.0]))["bw_comm"]  # the data's dims stay below 600
    assert predictor.plan_costs(np.zeros(2), np.array([6000.0, 6000.0]))["bw_comm"] == pytest.approx(high_dims)


def test_compute_model_is_additive_and_monotone_in_the_tables(tmp_path):
    models = train_cost_models(write_synthetic_costs(tmp_path / "costs.jsonl", 200, 20), seed=0, epochs=80, verbose=False, compute_head="monotone")
    predictor = models.predictor(2)
    pool = make_table_pool(seed=0)
    tables = [pool.table(i, int(d), f"t{i}") for i, d in enumerate([4, 16, 64, 8, 32])]
    features = torch.from_numpy(feature_matrix(tables))
    with torch.no_grad():  # the prediction is the mean of differently initialised members
        members = [m(features, torch.zeros(len(tables), dtype=torch.int64), 1) for m in models.compute.members]
    assert len(members) == ENSEMBLE_SIZE and float(torch.stack(members).std()) > 0
    assert float(predictor.device_compute(predictor.embed(tables).sum(axis=0))[0]) == pytest.approx(float(torch.stack(members).mean()), rel=1e-5)
    emb = predictor.embed(tables)
    assert (emb >= 0).all()
    lone = predictor.device_compute(emb)  # each table alone on a device
    offset = float(predictor.device_compute(np.zeros(emb.shape[1]))[0])
    together = float(predictor.device_compute(emb.sum(axis=0))[0])
    assert offset > 0 and together == pytest.approx(lone.sum() - (len(tables) - 1) * offset, rel=1e-9)
    costs = [float(predictor.device_compute(emb[:k].sum(axis=0))[0]) for k in range(1, len(tables) + 1)]
    assert all(b >= a for a, b in zip(costs, costs[1:]))  # adding a table never makes a device cheaper
    # the synthetic per-table cost is 0.002 x dim x pooling + 0.3 ms: the learned one follows it
    truth = np.array([0.002 * t.dim * t.pooling_factor + 0.3 for t in tables])
    assert np.corrcoef(lone - offset, truth)[0, 1] > 0.9


def test_the_papers_post_sum_mlp_head_trains_round_trips_and_predicts_as_torch(tmp_path):
    data = write_synthetic_costs(tmp_path / "costs.jsonl", 200, 20)
    models = train_cost_models(data, tmp_path / "models.pt", seed=0, epochs=80, verbose=False, compute_head="mlp")
    assert {m.head_kind for m in models.compute.members} == {"mlp"}
    assert models.metrics["compute"]["test_r2"] > 0.5
    loaded = CostModels.load(tmp_path / "models.pt")
    assert {m.head_kind for m in loaded.compute.members} == {"mlp"}
    pool = make_table_pool(seed=0)
    tables = [pool.table(i, int(d), f"t{i}") for i, d in enumerate([4, 16, 64, 8, 32])]
    predictor = loaded.predictor(2)
    with torch.no_grad():
        torch_ms = float(loaded.compute(torch.from_numpy(feature_matrix(tables)), torch.zeros(len(tables), dtype=torch.int64), 1)[0])
    assert float(predictor.device_compute(predictor.embed(tables).sum(axis=0))[0]) == pytest.approx(torch_ms, rel=1e-5)
    emb = predictor.embed(tables)
    together, lone = float(predictor.device_compute(emb.sum(axis=0))[0]), predictor.device_compute(emb)
    offset = float(predictor.device_compute(np.zeros(emb.shape[1]))[0])
    assert together != pytest.approx(lone.sum() - (len(tables) - 1) * offset, rel=1e-3)  # not additive over tables
