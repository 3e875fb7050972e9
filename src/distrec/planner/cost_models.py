"""NeuroShard's neural cost models: computation per device, forward and backward all-to-all.

- Computation: a shared per-table MLP (F -> 128 -> 32, ReLU: non-negative) embeds each table
  (or column shard) on a device; the embeddings are summed and a head predicts the device's
  forward+backward lookup time (ms). The default head is the NeuroShard paper's, an MLP
  after the sum (``compute_head="mlp"``: 32 -> 64 -> 1): it can learn that tables sharing a
  device do not cost the sum of their parts (the paper's Observation 2). The other,
  ``monotone``, is a linear map with positive weights (softplus of free parameters) and a
  positive offset: a device's cost is then the sum of learned non-negative per-table costs
  plus a constant, so adding a table never makes a device cheaper. The paper's head is the
  default because it had the lower held-out error and its plans executed cheaper
  (benchmarks/results/2026-11-25-neuroshard-compute-head.md). The loss is the MSE in ms. The
  prediction is the mean of an ensemble of such nets trained from different initialisations:
  a search picks the plans whose cost one net under-predicts most, and independently trained
  nets disagree on exactly those (benchmarks/results/2026-11-24-neuroshard-planner.md);
  averaging cancels much of that variance.
- Communication: one MLP per direction (in -> 128 -> 64 -> 32 -> 16 -> 1), shared by the
  devices, predicts a device's all-to-all time (ms) from its own summed output dimension
  and the mean and maximum over the devices (``comm_inputs``; the forward model also from
  its start delay and the mean and maximum delay). One pair per world size D. Devices are
  interchangeable, so the model is too: permuting the devices permutes the predictions,
  and every sample teaches the shared net D times. NeuroShard's net over all devices'
  inputs at once predicts other costs for the same dimension sums in another order.
  Re-predicting the executed plans of ``benchmarks/sharding.py`` (seeds 0 and 1, 8
  settings), its all-to-all time beyond the slowest device's compute had a mean
  within-task correlation of -0.01 with the executed one, the shared net's 0.10, and the
  share of a task's plan pairs ordered as executed rose from 0.79-0.91 to 0.83-0.92 per
  setting (in none fewer). A forward all-to-all cannot finish before the last
  device has started, so a device's forward time is its wait for the latest start
  (``start_wait_ms``, known exactly) plus what the forward model predicts: the learned part
  is the transfer, not a max over inputs that an MLP fits poorly from a few hundred samples.

A plan's cost on device r is compute_r + bw_r + fw_r, where the forward all-to-all of device
r starts late by (compute_r + bw_r) - min over devices, as in NeuroShard's simulator; the
plan costs the maximum over devices.
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

import distrec
from distrec.errors import DistrecError
from distrec.io import atomic_write_bytes
from distrec.planner.features import TABLE_FEATURE_NAMES, feature_matrix
from distrec.planner.launch import intra_op_threads
from distrec.planner.types import TableSpec, check_seed

COST_MODEL_FORMAT = 5
SAVED_PARTS = ("batch_size", "hardware", "metrics", "compute_members", "compute", "comm")
"""What ``CostModels.save`` writes besides the format stamp, feature names and compute head."""
TABLE_MLP = (128, 32)
ENSEMBLE_SIZE = 5
COMM_MLP = (128, 64, 32, 16)
POST_SUM_MLP = (64,)
ComputeHead = Literal["monotone", "mlp"]
COMPUTE_HEADS: tuple[ComputeHead, ...] = ("monotone", "mlp")
DEFAULT_COMPUTE_HEAD: ComputeHead = "mlp"  # the paper's; see the module doc


def _mlp(sizes: Iterable[int], final_relu: bool) -> nn.Sequential:
    sizes = list(sizes)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if final_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class _Standardised(nn.Module):
    """Inputs standardised with training statistics, outputs in units of ``target_scale`` ms.

    Inputs are first clamped to the range seen in training: an MLP extrapolates linearly and
    without bound, so one table with a feature far outside the training data (a histogram
    with mass in a bin no sample had) would otherwise get an absurd cost and mislead the
    search; at the edge of the data the prediction stays at the edge.
    """

    def __init__(self, num_inputs: int) -> None:
        super().__init__()
        self.register_buffer("input_mean", torch.zeros(num_inputs))
        self.register_buffer("input_std", torch.ones(num_inputs))
        self.register_buffer("input_low", torch.full((num_inputs,), -torch.inf))
        self.register_buffer("input_high", torch.full((num_inputs,), torch.inf))
        self.register_buffer("target_scale", torch.ones(()))

    def set_statistics(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.input_mean.copy_(inputs.mean(dim=0))
        self.input_std.copy_(inputs.std(dim=0).nan_to_num(0.0) + 1e-6)
        self.input_low.copy_(inputs.min(dim=0).values)
        self.input_high.copy_(inputs.max(dim=0).values)
        self.target_scale.copy_(targets.abs().mean().clamp_min(1e-6))

    def standardise(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.clamp(x, self.input_low, self.input_high) - self.input_mean) / self.input_std


def start_wait_ms(delays_ms: torch.Tensor | np.ndarray):
    """Each device's wait (ms) for the latest start among the devices (last axis)."""
    return delays_ms.max(-1, keepdims=True) - delays_ms if isinstance(delays_ms, np.ndarray) else delays_ms.amax(-1, keepdim=True) - delays_ms


class MonotoneHead(nn.Module):
    """A linear map with positive weights and a positive offset: [..., n] non-negative -> [...].

    Weights and offset are the softplus of free parameters, so the output grows with every
    input and is additive over the summands of its input.
    """

    def __init__(self, num_inputs: int) -> None:
        super().__init__()
        self.raw_weight = nn.Parameter(torch.full((num_inputs,), -4.0))
        self.raw_offset = nn.Parameter(torch.tensor(-2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ nn.functional.softplus(self.raw_weight) + nn.functional.softplus(self.raw_offset)

    def numpy_parameters(self) -> tuple[np.ndarray, float]:
        """(positive weights [n], positive offset) as float64, for NumPy predictions."""
        with torch.no_grad():
            weight, offset = nn.functional.softplus(self.raw_weight), nn.functional.softplus(self.raw_offset)
        return weight.double().numpy().copy(), float(offset)


class PostSumMLP(nn.Module):
    """The NeuroShard paper's head: an MLP on the summed table embeddings, [..., n] -> [...]."""

    def __init__(self, num_inputs: int) -> None:
        super().__init__()
        self.mlp = _mlp((num_inputs, *POST_SUM_MLP, 1), final_relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).squeeze(-1)


class ComputeCostNet(_Standardised):
    """Predicts a device's forward+backward lookup time (ms) from its tables' features.

    With the ``monotone`` head the time is additive over the tables: a sum of non-negative
    learned per-table costs plus a constant; with the ``mlp`` head (the paper's) an MLP of
    their summed embeddings. In units of ``target_scale``.
    """

    def __init__(self, num_features: int = len(TABLE_FEATURE_NAMES), head: ComputeHead = "monotone") -> None:
        super().__init__(num_features)
        self.table_mlp = _mlp((num_features, *TABLE_MLP), final_relu=True)
        self.head = MonotoneHead(TABLE_MLP[-1]) if head == "monotone" else PostSumMLP(TABLE_MLP[-1])

    @property
    def head_kind(self) -> ComputeHead:
        return "monotone" if isinstance(self.head, MonotoneHead) else "mlp"

    def numpy_head(self) -> list[tuple[np.ndarray, np.ndarray, bool]]:
        """The head as float64 layers for ``_run_numpy`` (output in units of ``target_scale``)."""
        if isinstance(self.head, MonotoneHead):
            weight, offset = self.head.numpy_parameters()
            return [(weight[:, None], np.array([offset]), False)]
        return _numpy_layers(self.head.mlp)

    def forward(self, features: torch.Tensor, group: torch.Tensor, num_groups: int) -> torch.Tensor:
        """features float [n, F] of all tables, group int64 [n] their device (0..num_groups-1) -> [num_groups] ms."""
        emb = self.table_mlp(self.standardise(features))
        summed = emb.new_zeros(num_groups, emb.shape[1]).index_add_(0, group, emb)
        return self.head(summed) * self.target_scale


class ComputeEnsemble(nn.Module):
    """The mean prediction (ms) of computation models trained from different initialisations."""

    def __init__(self, members: list[ComputeCostNet]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, features: torch.Tensor, group: torch.Tensor, num_groups: int) -> torch.Tensor:
        """As ``ComputeCostNet.forward``: [num_groups] ms, averaged over the members."""
        return torch.stack([m(features, group, num_groups) for m in self.members]).mean(dim=0)


COMM_INPUT_NAMES = ("dim_sum", "mean_dim_sum", "max_dim_sum")
DELAY_INPUT_NAMES = ("delay", "mean_delay", "max_delay")


def comm_inputs(dim_sums: np.ndarray, delays_ms: np.ndarray | None = None) -> np.ndarray:
    """Every device's inputs to a communication model: float64 [..., D, F].

    Args:
        dim_sums: summed output dimensions [..., D].
        delays_ms: start delays [..., D] for the forward model (taken relative to the
            earliest start), None for the backward model.

    Returns:
        Per device ``COMM_INPUT_NAMES`` (its dimension sum, the mean and the maximum over
        devices), followed with delays by ``DELAY_INPUT_NAMES`` likewise.
    """
    dims = np.asarray(dim_sums, dtype=np.float64)
    sources = [dims]
    if delays_ms is not None:
        delays = np.asarray(delays_ms, dtype=np.float64)
        sources.append(delays - delays.min(-1, keepdims=True))
    out = np.empty((*dims.shape, 3 * len(sources)))
    for k, x in enumerate(sources):
        out[..., 3 * k] = x
        out[..., 3 * k + 1] = x.mean(-1, keepdims=True)
        out[..., 3 * k + 2] = x.max(-1, keepdims=True)
    return out


class CommCostNet(_Standardised):
    """Predicts a device's all-to-all time (ms) from its ``comm_inputs`` row; shared by the devices."""

    def __init__(self, num_inputs: int) -> None:
        super().__init__(num_inputs)
        self.mlp = _mlp((num_inputs, *COMM_MLP, 1), final_relu=False)

    @classmethod
    def forward_model(cls) -> CommCostNet:
        """A net for the forward all-to-all (dimension and delay inputs)."""
        return cls(len(COMM_INPUT_NAMES) + len(DELAY_INPUT_NAMES))

    @classmethod
    def backward_model(cls) -> CommCostNet:
        """A net for the backward all-to-all (dimension inputs)."""
        return cls(len(COMM_INPUT_NAMES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x float [b, D, inputs] -> [b, D] ms."""
        return self.mlp(self.standardise(x)).squeeze(-1) * self.target_scale


@dataclass
class CostModels:
    """The trained models plus what they were measured on.

    Attributes:
        compute: the computation model (an ensemble).
        comm: world size -> (forward model, backward model).
        batch_size: samples per batch in the micro-benchmarks.
        hardware: torch version, CPU model, device type and name, world sizes.
        metrics: test MSE (ms^2) of each model.
    """

    compute: ComputeEnsemble
    comm: dict[int, tuple[CommCostNet, CommCostNet]]
    batch_size: int
    hardware: dict
    metrics: dict = field(default_factory=dict)

    def save(self, path: str | Path) -> None:
        """Write the models atomically with a format stamp and the hardware description."""
        state = {
            "format": COST_MODEL_FORMAT,
            "distrec_version": distrec.__version__,
            "feature_names": list(TABLE_FEATURE_NAMES),
            "batch_size": self.batch_size,
            "hardware": json.dumps(self.hardware),
            "metrics": json.dumps(self.metrics),
            "compute_members": len(self.compute.members),
            "compute_head": self.compute.members[0].head_kind,
            "compute": self.compute.state_dict(),
            "comm": {str(d): (fw.state_dict(), bw.state_dict()) for d, (fw, bw) in self.comm.items()},
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> CostModels:
        """Read models saved by ``save``; DistrecError if missing, unreadable or of another format."""
        p = Path(path)
        if not p.is_file():
            raise DistrecError(f"cost models {str(p)!r} not found; train them with 'distrec plan train-cost-models'")
        try:
            state = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
            raise DistrecError(f"cost models {str(p)!r} are unreadable ({type(e).__name__}); retrain them") from None
        if not isinstance(state, dict) or state.get("format") != COST_MODEL_FORMAT or state.get("feature_names") != list(TABLE_FEATURE_NAMES):
            raise DistrecError(
                f"cost models {str(p)!r} have another format than this distrec ({COST_MODEL_FORMAT}); retrain them with 'distrec plan train-cost-models'"
            )
        retrain = "retrain them with 'distrec plan train-cost-models'"
        missing = [k for k in SAVED_PARTS if k not in state]
        if missing:
            raise DistrecError(f"cost models {str(p)!r} lack {', '.join(missing)}; {retrain}")
        head = state.get("compute_head", "monotone")
        if head not in COMPUTE_HEADS:
            raise DistrecError(f"cost models {str(p)!r} have an unknown compute head {head!r}; retrain them")
        try:
            compute = ComputeEnsemble([ComputeCostNet(head=head) for _ in range(int(state["compute_members"]))])
            compute.load_state_dict(state["compute"])
            comm = {}
            for d, (fw_state, bw_state) in state["comm"].items():
                fw, bw = CommCostNet.forward_model(), CommCostNet.backward_model()
                fw.load_state_dict(fw_state)
                bw.load_state_dict(bw_state)
                comm[int(d)] = (fw, bw)
            return cls(compute.eval(), comm, int(state["batch_size"]), json.loads(state["hardware"]), json.loads(state["metrics"]))
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as e:  # load_state_dict: RuntimeError
            raise DistrecError(f"cost models {str(p)!r} are damaged: their weights do not load ({type(e).__name__}); {retrain}") from None

    def predictor(self, num_devices: int) -> CostPredictor:
        """Fast NumPy predictions for ``num_devices`` devices (what the search calls)."""
        if num_devices not in self.comm:
            have = ", ".join(str(d) for d in sorted(self.comm)) or "none"
            raise DistrecError(
                f"the cost models have no communication model for {num_devices} devices (they have: {have}); "
                f"run 'distrec plan collect --devices {num_devices}' and retrain"
            )
        return CostPredictor(self.compute, *self.comm[num_devices])


def _numpy_layers(seq: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """(weight^T, bias, relu after) for every Linear of a Sequential, as float64 arrays."""
    modules = list(seq)
    out = []
    for i, m in enumerate(modules):
        if isinstance(m, nn.Linear):
            relu = i + 1 < len(modules) and isinstance(modules[i + 1], nn.ReLU)
            out.append((m.weight.detach().double().numpy().T.copy(), m.bias.detach().double().numpy().copy(), relu))
    return out


def _run_numpy(layers: list[tuple[np.ndarray, np.ndarray, bool]], x: np.ndarray) -> np.ndarray:
    for w, b, relu in layers:
        x = x @ w + b
        if relu:
            np.maximum(x, 0.0, out=x)
    return x


class _Scaling:
    """A net's input statistics and output scale as NumPy arrays (see ``_Standardised``)."""

    def __init__(self, net: _Standardised) -> None:
        self.mean, self.std, self.low, self.high = (b.double().numpy() for b in (net.input_mean, net.input_std, net.input_low, net.input_high))
        self.target_scale = float(net.target_scale)

    def standardise(self, x: np.ndarray) -> np.ndarray:
        return (np.clip(x, self.low, self.high) - self.mean) / self.std


class CostPredictor:
    """NumPy copies of the trained nets for the search's many small predictions.

    The computation model is a sum over tables, so a table's embedding (the members' 32-wide
    embeddings side by side) is computed once (``embed``), and a device's cost is the
    members' mean linear head applied to the sum (``device_compute``).
    """

    def __init__(self, compute: ComputeEnsemble, fw: CommCostNet, bw: CommCostNet) -> None:
        members = list(compute.members)
        self._members = [(_numpy_layers(m.table_mlp), _Scaling(m)) for m in members]
        scales = [float(m.target_scale) / len(members) for m in members]
        width = TABLE_MLP[-1]
        if all(m.head_kind == "monotone" for m in members):  # one linear map of all members' embeddings
            heads = [m.numpy_head()[0] for m in members]
            weight = np.concatenate([w * scale for (w, _, _), scale in zip(heads, scales)])
            offset = sum(b * scale for (_, b, _), scale in zip(heads, scales))
            self._heads = [(slice(None), [(weight, offset, False)], 1.0)]
        else:  # each member's head on its slice of the summed embeddings
            self._heads = [(slice(k * width, (k + 1) * width), m.numpy_head(), scale) for k, (m, scale) in enumerate(zip(members, scales))]
        self._fw_layers, self._fw_scaling = _numpy_layers(fw.mlp), _Scaling(fw)
        self._bw_layers, self._bw_scaling = _numpy_layers(bw.mlp), _Scaling(bw)

    def embed(self, tables: list[TableSpec]) -> np.ndarray:
        """float64 [n, 32 x members] embeddings of tables (or column shards, as tables of their width)."""
        features = feature_matrix(tables).astype(np.float64)
        return np.concatenate([_run_numpy(layers, scaling.standardise(features)) for layers, scaling in self._members], axis=1)

    def device_compute(self, summed_embeddings: np.ndarray) -> np.ndarray:
        """Predicted lookup time (ms) of devices from their summed embeddings [..., 32 x members]."""
        x = np.atleast_2d(summed_embeddings)
        return sum(_run_numpy(layers, x[:, part])[:, 0] * scale for part, layers, scale in self._heads)

    def plan_costs(self, compute_ms: np.ndarray, dim_sums: np.ndarray) -> dict[str, np.ndarray]:
        """Per-device predicted costs (ms): compute, bw_comm, fw_comm and their total."""
        compute_ms = np.asarray(compute_ms, dtype=np.float64)
        dims = np.asarray(dim_sums, dtype=np.float64)
        bw = self._comm(self._bw_layers, self._bw_scaling, comm_inputs(dims))
        ready = compute_ms + bw
        fw = self._comm(self._fw_layers, self._fw_scaling, comm_inputs(dims, ready)) + start_wait_ms(ready)
        return {"compute": compute_ms, "bw_comm": bw, "fw_comm": fw, "total": compute_ms + bw + fw}

    def placement_costs(self, device_tables: list[list[TableSpec]]) -> dict[str, np.ndarray]:
        """Per-device predicted costs (ms) of devices holding these tables (or column shards)."""
        compute = np.array([self.device_compute(self.embed(ts).sum(axis=0))[0] if ts else 0.0 for ts in device_tables])
        return self.plan_costs(compute, np.array([sum(t.dim for t in ts) for ts in device_tables]))

    @staticmethod
    def _comm(layers, scaling: _Scaling, inputs: np.ndarray) -> np.ndarray:
        """[D] ms from one plan's ``comm_inputs`` [D, F]."""
        return _run_numpy(layers, scaling.standardise(inputs))[:, 0] * scaling.target_scale


# ----------------------------------------------------------------------------- training


@dataclass
class _ComputeData:
    """Compute samples: features of every table of every sample, grouped by sample."""

    features: torch.Tensor  # [rows, F]
    offsets: np.ndarray  # [samples + 1]
    targets: torch.Tensor  # [samples]

    def __len__(self) -> int:
        return self.targets.numel()

    def predict(self, net: ComputeCostNet, idx: np.ndarray) -> torch.Tensor:
        lengths = self.offsets[idx + 1] - self.offsets[idx]
        starts = np.repeat(self.offsets[idx] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        rows = starts + np.arange(lengths.sum())
        group = torch.from_numpy(np.repeat(np.arange(idx.size), lengths))
        return net(self.features[torch.from_numpy(rows)], group, idx.size)


@dataclass
class _CommData:
    inputs: torch.Tensor  # [samples, devices, inputs]
    targets: torch.Tensor  # [samples, devices]

    def __len__(self) -> int:
        return self.targets.shape[0]

    def predict(self, net: CommCostNet, idx: np.ndarray) -> torch.Tensor:
        return net(self.inputs[torch.from_numpy(idx)])


def fit(
    net: nn.Module,
    data: _ComputeData | _CommData,
    seed: int = 0,
    epochs: int = 1000,
    patience: int = 60,
    lr: float = 3e-3,
    batch_size: int = 128,
) -> dict[str, float]:
    """Train ``net`` with Adam on an 80/10/10 split, keeping the weights of the best validation loss.

    Stops when the validation MSE has not improved for ``patience`` epochs.

    Returns:
        MSE (ms^2) on the train, validation and test parts, the variance of the test
        targets (the MSE of always predicting their mean), the test R^2 (1 - MSE / variance)
        and median relative error, the validation MSE before training, and the epochs run.
    """
    gen = torch.Generator().manual_seed(seed)
    parts = _split(len(data), seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr)

    def mse(idx: np.ndarray) -> float:
        net.eval()
        with torch.no_grad():
            return float(_errors(net, data, idx).square().mean())

    initial_val = mse(parts["val"])
    best = (initial_val, copy.deepcopy(net.state_dict()))
    since_best = epoch = 0
    for epoch in range(1, epochs + 1):  # noqa: B007 (the last epoch is reported)
        net.train()
        train = parts["train"][torch.randperm(parts["train"].size, generator=gen).numpy()]
        for start in range(0, train.size, batch_size):
            idx = train[start : start + batch_size]
            loss = _errors(net, data, idx).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        val = mse(parts["val"])
        if val < best[0]:
            best, since_best = (val, copy.deepcopy(net.state_dict())), 0
        else:
            since_best += 1
            if since_best >= patience:
                break
    net.load_state_dict(best[1])
    return {**evaluate(net, data, seed), "initial_val_mse": initial_val, "epochs": epoch}


def _errors(net: nn.Module, data: _ComputeData | _CommData, idx: np.ndarray) -> torch.Tensor:
    """Predicted minus measured time (ms) of samples ``idx``."""
    return data.predict(net, idx) - data.targets[torch.from_numpy(idx)]


def _split(n: int, seed: int) -> dict[str, np.ndarray]:
    """Sample indices of the 80/10/10 train, validation and test parts."""
    if n < 10:
        raise DistrecError(f"only {n} cost samples; collect at least 10 (better thousands) with 'distrec plan collect'")
    order = np.random.default_rng(seed).permutation(n)
    return {"train": order[: int(0.8 * n)], "val": order[int(0.8 * n) : int(0.9 * n)], "test": order[int(0.9 * n) :]}


def evaluate(net: nn.Module, data: _ComputeData | _CommData, seed: int) -> dict[str, float]:
    """MSE (ms^2) of each part of ``fit``'s split of ``seed``, the test variance, R^2 and median relative error."""
    parts = _split(len(data), seed)
    net.eval()
    with torch.no_grad():
        errors = {k: _errors(net, data, idx) for k, idx in parts.items()}
    mse = {f"{k}_mse": float(e.square().mean()) for k, e in errors.items()}
    test_targets = data.targets[torch.from_numpy(parts["test"])]
    test_var = float(test_targets.var(unbiased=False))
    relative = (errors["test"].abs() / test_targets.abs().clamp_min(1e-3)).median()
    return {
        **mse,
        "test_target_var": test_var,
        "test_r2": 1.0 - mse["test_mse"] / test_var if test_var > 0 else 0.0,
        "test_median_relative_error": float(relative),
    }


HARDWARE_KEYS = ("torch", "cpu", "device_type", "device_name")
MAX_SAMPLE_MS = 3_600_000.0
"""The longest time (ms) a cost record may hold: an hour, far beyond any micro-benchmark step."""
SAMPLE_KEYS = {
    "compute": ("id", "batch_size", "tables", "ms"),
    "comm": ("id", "world_size", "batch_size", "dim_sums", "delays_ms", "fw_ms", "bw_ms"),
}


def read_cost_samples(paths: list[str | Path]) -> tuple[list[dict], list[dict], dict]:
    """The compute and comm records of ``distrec plan collect`` JSONL files, and their hardware.

    Raises DistrecError naming the file and line of a record that is not one, or holds a
    time that is not a finite number of ms from 0 to ``MAX_SAMPLE_MS``, and if the files
    were measured on different hardware.
    """
    compute, comm, hardware, world_sizes = [], [], None, set()
    for path in paths:
        p = Path(path)
        for line_no, line in enumerate(cost_data_lines(p), 1):
            if not line.strip():
                continue
            where = f"cost data {str(p)!r} line {line_no}"
            try:
                rec = json.loads(line)
                kind = rec["kind"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DistrecError(f"{where} is not a cost record; delete the line or re-collect") from None
            if kind == "hardware":
                described = {k: rec.get(k) for k in HARDWARE_KEYS}
                if hardware is not None and described != hardware:
                    raise DistrecError(f"{str(p)!r} was measured on {described}, other data on {hardware}; train on one machine's data")
                hardware = described
                world_sizes.update(rec.get("world_sizes", []))
            elif kind in SAMPLE_KEYS:
                check_cost_sample(rec, where)
                (compute if kind == "compute" else comm).append(rec)
    return compute, comm, {**(hardware or {}), "world_sizes": sorted(world_sizes)}


def cost_data_lines(path: Path) -> list[str]:
    """The lines of a cost data file; DistrecError if it is missing or not text."""
    if not path.is_file():
        raise DistrecError(f"cost data {str(path)!r} not found; produce it with 'distrec plan collect'")
    try:
        return path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DistrecError(
            f"cost data {str(path)!r} is not text (byte {e.start} is not UTF-8), so not the JSON lines 'distrec plan collect' writes; move it away or name another file"
        ) from None


def check_cost_sample(rec: dict, where: str) -> None:
    """DistrecError naming ``where`` unless a compute or comm record holds every field
    training reads, of the right kind, and only plausible times."""
    fix = "delete the line or re-collect"
    kind = rec["kind"]
    missing = [k for k in SAMPLE_KEYS[kind] if k not in rec]
    if missing:
        raise DistrecError(f"{where} is a {kind} record without {', '.join(missing)}; {fix}")
    if not _is_count(rec["batch_size"], 1):
        raise DistrecError(f"{where} has batch_size {rec['batch_size']!r}; it must be a positive integer: {fix}")
    if kind == "compute":
        if not isinstance(rec["tables"], list) or not rec["tables"]:
            raise DistrecError(f"{where} has no list of tables; {fix}")
        for k, table in enumerate(rec["tables"]):
            try:
                TableSpec.from_dict(table, f"table {k}")
            except DistrecError as e:
                raise DistrecError(f"{where}: {e}") from None
        times = {"ms": [rec["ms"]]}
    else:
        devices = rec["world_size"]
        if not _is_count(devices, 1):
            raise DistrecError(f"{where} has world_size {devices!r}; it must be a positive integer: {fix}")
        for key in ("dim_sums", "delays_ms", "fw_ms", "bw_ms"):
            if not isinstance(rec[key], list) or len(rec[key]) != devices:
                raise DistrecError(f"{where} has {key} {rec[key]!r}; it must list one value per device ({devices}): {fix}")
        if not all(_is_count(d, 0) for d in rec["dim_sums"]):
            raise DistrecError(f"{where} has dim_sums {rec['dim_sums']!r}; they must be integers >= 0: {fix}")
        times = {key: rec[key] for key in ("delays_ms", "fw_ms", "bw_ms")}
    for key, values in times.items():
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SAMPLE_MS:
                raise DistrecError(f"{where} has {key} {value!r}; a measured time must be a number of ms from 0 to {MAX_SAMPLE_MS:.0f}: {fix}")


def _is_count(value: object, minimum: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def train_cost_models(
    data_paths: list[str | Path] | str | Path,
    out_path: str | Path | None = None,
    seed: int = 0,
    epochs: int = 1000,
    patience: int = 60,
    verbose: bool = True,
    compute_head: ComputeHead = DEFAULT_COMPUTE_HEAD,
) -> CostModels:
    """Train the computation and communication models from collected micro-benchmarks.

    Args:
        data_paths: one or more JSONL files written by ``run_collect``.
        out_path: where to save the models (atomically); None to skip saving.
        seed: seed of the split, the initialisation and the batch order.
        epochs: the most epochs per model; early stopping usually ends sooner.
        patience: epochs without a better validation MSE before stopping.
        verbose: print each model's test MSE.
        compute_head: ``mlp`` (the default: the paper's MLP after the sum) or ``monotone``
            (additive over tables); see the module doc.
    """
    check_seed(seed)
    paths = [data_paths] if isinstance(data_paths, (str, Path)) else list(data_paths)
    compute_recs, comm_recs, hardware = read_cost_samples(paths)
    if not compute_recs:
        raise DistrecError("the cost data has no compute samples; run 'distrec plan collect' with compute samples")
    batch_sizes = {r["batch_size"] for r in compute_recs + comm_recs}
    if len(batch_sizes) != 1:
        raise DistrecError(f"the cost data mixes batch sizes {sorted(batch_sizes)}; train on files collected with one batch size")
    tables = [[TableSpec.from_dict(t, f"compute sample {r['id']}") for t in r["tables"]] for r in compute_recs]
    lengths = np.array([len(t) for t in tables])
    compute_data = _ComputeData(
        torch.from_numpy(feature_matrix([t for ts in tables for t in ts])),
        np.concatenate([[0], np.cumsum(lengths)]),
        torch.tensor([r["ms"] for r in compute_recs], dtype=torch.float32),
    )
    # one thread: the nets are tiny and more threads only add synchronisation
    with intra_op_threads(1), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        compute, comm, metrics = _fit_all(compute_data, comm_recs, seed, epochs, patience, compute_head)
    models = CostModels(compute, comm, batch_sizes.pop(), hardware, metrics)
    if verbose:
        for name, m in metrics.items():
            print(
                f"{name}: test MSE {m['test_mse']:.4g} ms^2 against a test variance of {m['test_target_var']:.4g} ms^2 "
                f"(R^2 {m['test_r2']:.3f}, median relative error {m['test_median_relative_error']:.1%}; "
                f"validation MSE {m['val_mse']:.4g}" + (f", {m['epochs']} epochs)" if "epochs" in m else ")")
            )
    if out_path is not None:
        models.save(out_path)
    return models


def _fit_all(compute_data: _ComputeData, comm_recs: list[dict], seed: int, epochs: int, patience: int, compute_head: ComputeHead):
    """Train the computation model and a forward/backward pair per world size in the comm records."""
    members, runs = [], []
    for _ in range(ENSEMBLE_SIZE):  # same split and batches, another initialisation each
        member = ComputeCostNet(head=compute_head)
        member.set_statistics(compute_data.features, compute_data.targets)
        runs.append(fit(member, compute_data, seed, epochs, patience))
        members.append(member)
    compute = ComputeEnsemble(members)
    metrics = {
        "compute": {
            **evaluate(compute, compute_data, seed),
            "initial_val_mse": float(np.mean([r["initial_val_mse"] for r in runs])),
            "epochs": max(r["epochs"] for r in runs),
        }
    }
    comm = {}
    for d in sorted({r["world_size"] for r in comm_recs}):
        recs = [r for r in comm_recs if r["world_size"] == d]
        dims = np.array([r["dim_sums"] for r in recs], dtype=np.float64)
        delays = np.array([r["delays_ms"] for r in recs], dtype=np.float64)
        nets = []
        wait = start_wait_ms(delays)
        for direction, net, inputs, known in (
            ("fw", CommCostNet.forward_model(), comm_inputs(dims, delays), wait),
            ("bw", CommCostNet.backward_model(), comm_inputs(dims), np.zeros_like(dims)),
        ):
            # the forward model learns the time beyond the known wait (its metrics are of that part)
            measured = np.array([r[f"{direction}_ms"] for r in recs], dtype=np.float64)
            data = _CommData(torch.from_numpy(inputs).float(), torch.from_numpy(measured - known).float())
            net.set_statistics(data.inputs.flatten(0, 1), data.targets)
            metrics[f"{direction}_comm_{d}"] = fit(net, data, seed, epochs, patience)
            nets.append(net)
        comm[d] = (nets[0], nets[1])
    return compute, comm, metrics
