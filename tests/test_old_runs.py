"""Run directories written by an earlier distrec (before checkpoint formats were tagged and
the resolved settings had their own file) still evaluate and resume.

``tests/data/runs-before-format-tags`` holds three tiny runs trained for 6 steps by that
version: one process (block checkpoint), one process with Hotline's tiers, and 2 processes
with row-wise sharding. Their data is synthetic, made again from the saved config.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from distrec.components.checkpoint import load_state, read_meta
from distrec.modes import format_tag
from distrec.train.evaluate import evaluate_checkpoint
from distrec.train.loop import train
from distrec.train.run import resume_config

OLD_RUNS = Path(__file__).parent / "data" / "runs-before-format-tags"
KINDS = {"single": "blocks", "hotline": "hotline-tiers", "sharded2": "blocks"}


@pytest.fixture
def old_run(request, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))
    run = tmp_path / request.param
    shutil.copytree(OLD_RUNS / request.param, run)
    return run


@pytest.mark.parametrize("old_run", list(KINDS), indirect=True)
def test_an_old_checkpoint_is_recognised_and_scores_as_its_run_reported(old_run):
    meta = read_meta(old_run / "checkpoint")
    assert "format" not in meta
    assert format_tag(load_state(old_run / "checkpoint", 0), meta) == KINDS[old_run.name]
    reported = json.loads((old_run / "summary.json").read_text())
    scored = evaluate_checkpoint(old_run, None, None, progress=False)
    assert scored["auc"] == pytest.approx(reported["auc"], abs=1e-6)
    assert scored["logloss"] == pytest.approx(reported["logloss"], abs=1e-6)


@pytest.mark.parametrize("old_run", list(KINDS), indirect=True)
def test_an_old_run_resumes_and_its_new_checkpoint_is_tagged(old_run):
    cfg = resume_config(old_run, epochs=None, max_steps=8, eval_every=None)
    summary = train(cfg, old_run, resume=True, progress=False)
    assert summary["steps"] == 8
    assert read_meta(old_run / "checkpoint")["format"] == KINDS[old_run.name]
    assert json.loads((old_run / "resolved.json").read_text())["batch_size"] == cfg.train.batch_size
