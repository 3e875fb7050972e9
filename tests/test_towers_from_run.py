"""``distrec partition`` on a model trained on synthetic data with planted interaction groups."""

from __future__ import annotations

import json

import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from distrec.cli import main
from distrec.config import SyntheticConfig
from distrec.data.batch import Batch
from distrec.data.synthetic import interaction_groups
from distrec.towers.from_run import pairwise_interaction

FEATURES, GROUPS = 12, 4
SYNTHETIC = dict(num_sparse=FEATURES, num_dense=0, interaction_groups=GROUPS, rows=60_000, table_rows=40)


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """A small DLRM (linear top) trained on data whose click logit has 4 planted feature groups."""
    root = tmp_path_factory.mktemp("planted")
    overrides = [f"data.synthetic.{k}={v}" for k, v in SYNTHETIC.items()] + [
        "data.max_ind_range=40",
        "model.top_mlp=[]",
        "train.batch_size=512",
        "train.optimizer=adam",
        "train.embedding_optimizer=adam",
        "train.lr=0.02",
        "train.embedding_lr=0.1",
        "train.seed=0",
        f"data.cache_dir={root / 'cache'}",
    ]
    argv = ["train", "--preset", "tiny", "--max-steps", "400", "--out", str(root / "run"), "--no-progress"]
    assert main(argv + [a for o in overrides for a in ("--set", o)]) == 0
    return root


def _ari(path) -> float:
    towers = json.loads(path.read_text())["towers"]
    tower_of = {name: t for t, tower in enumerate(towers) for name in tower}
    planted = interaction_groups(SyntheticConfig(**SYNTHETIC))
    return adjusted_rand_score(planted, [tower_of[f"C{i + 1}"] for i in range(FEATURES)])


def test_coherent_towers_recover_the_planted_groups_and_naive_ones_do_not(planted_run, capsys):
    scores = {}
    for strategy in ("coherent", "naive"):
        out = planted_run / f"{strategy}.json"
        argv = [
            "partition",
            "--checkpoint",
            str(planted_run / "run"),
            "--towers",
            "4",
            "--strategy",
            strategy,
            "--max-ratio",
            "1.5",
            "-o",
            str(out),
            "--no-progress",
        ]
        assert main(argv) == 0
        printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert printed["tower_sizes"] == [3, 3, 3, 3]
        assert (planted_run / f"{strategy}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        scores[strategy] = _ari(out)
    assert scores["coherent"] >= 0.9, scores
    assert scores["naive"] < 0.9, scores


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--towers", "13"], "13 towers for 12 features"),
        (["--towers", "5", "--max-ratio", "1.0"], "--max-ratio"),
        (["--towers", "2", "--sample-rows", "1"], "--sample-rows 1 is too small"),
    ],
)
def test_partition_errors_are_one_line(planted_run, capsys, extra, message):
    argv = ["partition", "--checkpoint", str(planted_run / "run"), "-o", str(planted_run / "x.json"), "--no-progress"]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("distrec: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["partition", "--checkpoint", str(tmp_path / "nope"), "--towers", "2", "-o", str(tmp_path / "t.json")]) == 2
    assert capsys.readouterr().err.startswith("distrec: error: ")


def test_pairwise_interaction_sees_only_the_pairs_a_model_multiplies():
    """A model whose logit is <E_0, E_1> + |E_2|: only the pair (0, 1) interacts."""

    class DenseAsPooled(torch.nn.Module):
        def forward(self, batch):
            return batch.dense.view(-1, 3, 2)

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = DenseAsPooled()

        def forward(self, batch):
            e = self.embeddings(batch)
            return (e[:, 0] * e[:, 1]).sum(1) + e[:, 2].abs().sum(1)

    gen = torch.Generator().manual_seed(0)
    batch = Batch(torch.randn(256, 6, generator=gen), torch.zeros(0, dtype=torch.int64), torch.zeros(769, dtype=torch.int64), torch.zeros(256))
    toy = Toy()
    original = toy.embeddings
    interaction = pairwise_interaction(toy, batch)
    assert toy.embeddings is original
    assert interaction[0, 1] == interaction[1, 0] == 1.0
    assert interaction[0, 2] < 1e-6 and interaction[1, 2] < 1e-6
