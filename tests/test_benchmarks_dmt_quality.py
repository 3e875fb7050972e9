"""The DMT quality benchmark's pieces: early stopping on the validation split, paired differences."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import dmt_quality as dq  # noqa: E402

TINY_CRITEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo" / "criteo_kaggle_tiny.tsv"


def test_paired_difference_matches_the_closed_forms():
    diff = dq.paired_difference([0.71, 0.72, 0.73], [0.70, 0.70, 0.70])  # differences 0.01, 0.02, 0.03
    assert diff["mean"] == pytest.approx(0.02) and diff["sd"] == pytest.approx(0.01)
    # t = mean / (sd / sqrt(3)) with 2 degrees of freedom: two-sided p = 1 - |t| / sqrt(t^2 + 2)
    t = 0.02 / (0.01 / math.sqrt(3))
    assert diff["p_paired_t"] == pytest.approx(1 - t / math.sqrt(t * t + 2))
    assert diff["p_wilcoxon"] == pytest.approx(2 / 8)  # exact: all 3 signs positive, one of 2^3 sign patterns per side
    assert dq.paired_difference([0.7, 0.7], [0.7, 0.7])["p_paired_t"] is None


@pytest.mark.skipif(not TINY_CRITEO.exists(), reason="needs ../shared/data/criteo")
def test_train_best_leaves_the_model_at_its_best_validation_epoch():
    from distrec.data import Dataset, prepare
    from distrec.models.build import build_model
    from distrec.train.evaluate import evaluate

    cfg = dq.model_config("dlrm", "criteo", TINY_CRITEO, dim=4)
    dataset = Dataset(prepare(cfg.data, progress=False), cfg.data)
    split = dataset.split("random:0.3:0.3", seed=0)
    torch.manual_seed(0)
    model = build_model(cfg.model, dataset.num_dense, dataset.tables(4))
    args = argparse.Namespace(batch_size=16, lr=0.01, embedding_lr=0.1)
    trained = dq.train_best(model, dataset, split, 6, seed=0, args=args)
    assert len(trained.val_auc) == 6
    assert trained.epoch == int(np.argmax(trained.val_auc)) + 1
    assert trained.epoch < 6  # this seed overfits the 60 training rows: the model must go back to an earlier epoch
    cpu = torch.device("cpu")
    assert evaluate(model, dataset, split["val"], 64, cpu)["auc"] == pytest.approx(trained.val_auc[trained.epoch - 1])
    assert evaluate(model, dataset, split["test"], 64, cpu)["auc"] == pytest.approx(trained.test_auc)
