"""Tables larger than RAM: the benchmark on a tiny table, the table's removal, the table's
size choice, and ``distrec train --hotline`` on a table file set through the config, resumed."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from distrec.cli import main
from distrec.errors import DistrecError
from distrec.hotline.row_files import BASE_FILE, SavedRows
from distrec.hotline.tiers import TwoTierStore
from distrec.train.evaluate import evaluate_checkpoint, load_trained_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import hotline_beyond_ram as bench  # noqa: E402

BENCHMARK = Path(bench.__file__)
TINY = ["--keep-free-gb", "0", "--dim", "8", "--bottom-mlp", "16", "8", "--top-mlp", "16", "--batch-size", "64", "--learn-steps", "4",
        "--warmup-steps", "1", "--timed-steps", "4", "--block-steps", "2", "--hot-budget", "256KB", "--sample-rate", "1"]  # fmt: skip


def test_benchmark_trains_every_system_and_removes_the_table(tmp_path):
    argv = [sys.executable, str(BENCHMARK), *TINY, "--table-gb", "0.002", "--scaled-gb", "0.001", "--out", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    systems = {s["system"]: s for s in result["systems"]}
    assert sorted(systems) == ["hotline", "hotline_unplaced", "in_memory_scaled", "mmap", "readahead"]
    assert all(len(s["rounds"]) == 4 and s["unit"] == "ms" for s in systems.values())
    assert result["table_rows"] == 2_000_000 // (8 * 4) + 25 * 100 and result["table_gb"] == pytest.approx(0.002, rel=0.2)
    assert result["hot_rows"] > 0 and 0 < result["popular_fraction"] <= 1
    assert result["ratio"] == result["ratio_vs_mmap"] == systems["hotline"]["samples_per_s"] / systems["mmap"]["samples_per_s"]
    hotline = systems["hotline"]
    assert 0 < hotline["peak_RssAnon_bytes"] <= hotline["peak_VmHWM_bytes"]
    assert result["peak_rss_fraction_of_ram"] == hotline["peak_VmHWM_bytes"] / result["ram_bytes"]
    assert "NOT larger than RAM" in result["note"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hotline-beyond-ram.json"]  # the table's file is gone


def test_sigterm_while_building_removes_the_table(tmp_path):
    argv = [sys.executable, str(BENCHMARK), *TINY, "--table-gb", "0.4", "--scaled-gb", "0.001", "--out", str(tmp_path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    table = tmp_path / bench.TABLE_FILE
    deadline = time.monotonic() + 120
    while not table.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert table.exists(), "the table's file never appeared"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "stopped by signal" in err
    assert not table.exists()


def test_table_size_follows_ram_and_never_eats_the_kept_free_space(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "ram_bytes", lambda: 24 * bench.GB)
    monkeypatch.setattr(bench.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(100 * bench.GB, 30 * bench.GB, 70 * bench.GB))
    chosen, why = bench.choose_table_bytes(0, tmp_path, keep_free_gb=20)
    assert chosen == 36 * bench.GB and "1.5x RAM" in why and "larger than RAM" in why
    chosen, why = bench.choose_table_bytes(0, tmp_path, keep_free_gb=40)
    assert chosen == 30 * bench.GB and "the disk's room" in why
    assert bench.choose_table_bytes(2, tmp_path, keep_free_gb=20)[0] == 2 * bench.GB
    with pytest.raises(SystemExit, match="at most 50.0"):
        bench.choose_table_bytes(51, tmp_path, keep_free_gb=20)
    with pytest.raises(SystemExit, match="no room"):
        bench.choose_table_bytes(0, tmp_path, keep_free_gb=69)


ROWS, DIM = 26 * 2000, 8  # the tiny preset's 26 tables of data.synthetic.table_rows rows, dim 8, SGD (no row state)
RUN = ["--preset", "tiny", "--set", "data.synthetic.rows=1200", "--set", "data.synthetic.table_rows=2000", "--set", "train.threads=1",
       "--batch-size", "64", "--seed", "3", "--no-progress", "--optimizer", "sgd", "--hotline", "--hot-budget", "8KB",
       "--sample-rate", "0.5", "--relearn-every", "4"]  # fmt: skip


def mapped_file(tensor: torch.Tensor) -> str | None:
    """The file this process maps at ``tensor``'s first byte (``/proc/self/maps``), if any."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split(maxsplit=5)
        start, end = (int(a, 16) for a in span.split("-"))
        if start <= address < end:
            return rest[4] if len(rest) == 5 else None
    return None


def test_distrec_train_hotline_trains_in_a_table_file_and_resumes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))
    start = np.random.default_rng(0).uniform(-0.1, 0.1, (ROWS, DIM)).astype(np.float32)
    for name in ("whole", "halves"):
        start.tofile(tmp_path / f"{name}.f32")
    table = ["--set", f"hotline.slow_tier_file={tmp_path / 'whole.f32'}"]
    assert main(["train", *RUN, *table, "--max-steps", "22", "--out", str(tmp_path / "whole")]) == 0
    table = ["--set", f"hotline.slow_tier_file={tmp_path / 'halves.f32'}"]
    assert main(["train", *RUN, *table, "--max-steps", "10", "--out", str(tmp_path / "halves")]) == 0
    assert main(["train", "--resume", str(tmp_path / "halves"), "--max-steps", "22", "--no-progress"]) == 0
    capsys.readouterr()
    assert (tmp_path / "halves" / "checkpoint" / "hotline-rows-changed-ids.npy").is_file()  # the resumed run saved only what changed
    rows = {name: SavedRows(tmp_path / name / "checkpoint").rows(0, ROWS) for name in ("whole", "halves")}
    np.testing.assert_array_equal(rows["whole"], rows["halves"])
    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())["hotline"]
    assert summary["slow_tier"] == "disk" and summary["relearns"] == 5 and summary["hot_rows"] > 0
    trained = np.fromfile(tmp_path / "whole.f32", dtype=np.float32).reshape(ROWS, DIM)  # trained in place
    hot = np.load(tmp_path / "whole" / "checkpoint" / "hotline-hot-ids.npy")
    cold = np.setdiff1d(np.arange(ROWS), hot)
    np.testing.assert_array_equal(trained[cold], rows["whole"][cold])  # hot rows' file copies are stale until they leave
    assert not np.array_equal(trained[cold], start[cold])
    # what distrec evaluate uses: the saved rows mapped (base, changed rows over it), not read into memory
    model, *_ = load_trained_model(tmp_path / "halves", torch.device("cpu"))
    weight = model.embeddings.weight.detach()
    assert mapped_file(weight) == str((tmp_path / "halves" / "checkpoint" / BASE_FILE).resolve())
    np.testing.assert_array_equal(weight.numpy(), rows["halves"])
    base = np.load(tmp_path / "halves" / "checkpoint" / BASE_FILE)
    scores = [evaluate_checkpoint(tmp_path / name, None, None, progress=False) for name in ("whole", "halves")]
    assert scores[0]["auc"] == scores[1]["auc"] and scores[0]["logloss"] == scores[1]["logloss"]
    np.testing.assert_array_equal(np.load(tmp_path / "halves" / "checkpoint" / BASE_FILE), base)  # evaluating writes no saved row


def test_a_table_file_of_the_wrong_size_or_with_a_host_tier_is_refused(tmp_path):
    path = tmp_path / "rows.f32"
    np.zeros((10, 4), np.float32).tofile(path)
    with pytest.raises(DistrecError, match="has 160 bytes, not the 176 of 11 rows of 4 float32"):
        TwoTierStore(11, 4, torch.device("cpu"), init=None, slow_file=path)
    with pytest.raises(DistrecError, match="needs the disk slow tier"):
        TwoTierStore(10, 4, torch.device("cpu"), init=None, slow="host", slow_file=path)
    with TwoTierStore(10, 4, torch.device("cpu"), init=None, slow_file=path) as store:  # "auto" maps the file
        assert store.slow_kind == "disk" and store.slow_directory == tmp_path
