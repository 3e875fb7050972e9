"""Checkpoints are atomic: a run killed while saving leaves the previous checkpoint usable."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from distrec import io
from distrec.cli import main
from distrec.components.checkpoint import (
    CHECKSUMS,
    IDENTITIES,
    META_CHECKSUM,
    META_FILE,
    file_checksum,
    find_checkpoint,
    has_checkpoint,
    meta_checksum,
    read_meta,
)
from distrec.errors import DistrecError
from distrec.models.embedding import EmbeddingBagCollection
from distrec.parallel.reshard import export_blocks
from distrec.tables import TableConfig
from distrec.train.evaluate import load_trained_model
from test_cli import assert_one_line_error
from tiny_runs import tiny_cli_flags

TINY = tiny_cli_flags(600, "--batch-size", "64", "--seed", "5", "--optimizer", "adagrad")

# Runs `distrec ARGV` in a fresh process whose torch.save writes part of a file and then
# kills the process on the spot (no clean-up handlers run, as with SIGKILL or a power cut).
KILLED_IN_SAVE = textwrap.dedent("""
    import os, sys, torch
    def save(obj, f, *args, **kwargs):
        with open(f, "wb") as out:
            out.write(b"half a checkpoint")
        os._exit(9)
    torch.save = save
    from distrec.cli import main
    main(sys.argv[1:])
""")


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))


def train(*argv) -> None:
    assert main(["train", *map(str, argv)]) == 0


def parameters(run):
    model, *_ = load_trained_model(run, torch.device("cpu"))
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_run_killed_mid_save_keeps_the_previous_checkpoint_and_resumes_exactly(tmp_path, capsys):
    run = tmp_path / "run"
    train(*TINY, "--max-steps", 4, "--out", run)
    before = parameters(run)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_IN_SAVE, "train", "--resume", str(run), "--max-steps", "8", "--no-progress"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == 9, killed.stderr
    assert any(p.name.endswith(".tmp") for p in run.iterdir())  # the half-written checkpoint is left behind
    assert read_meta(find_checkpoint(run))["step"] == 4
    assert_same(parameters(run), before)
    # the interrupted run resumes from step 4 and ends where an uninterrupted run ends
    train("--resume", run, "--max-steps", 8, "--no-progress")
    train(*TINY, "--max-steps", 8, "--out", tmp_path / "whole")
    capsys.readouterr()
    assert_same(parameters(run), parameters(tmp_path / "whole"))
    assert json.loads((run / "summary.json").read_text())["steps"] == 8


def test_save_failing_part_way_leaves_the_checkpoint_unchanged(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    train(*TINY, "--max-steps", 4, "--out", run)
    before = parameters(run)
    real_save = torch.save

    def save_then_fail(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", save_then_fail)
    with pytest.raises(OSError, match="No space"):
        main(["train", "--resume", str(run), "--max-steps", "8", "--no-progress"])
    monkeypatch.undo()
    capsys.readouterr()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".checkpoint")) == []  # no debris
    assert read_meta(find_checkpoint(run))["step"] == 4
    assert_same(parameters(run), before)


def test_kill_between_the_two_renames_falls_back_to_the_old_checkpoint(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    train(*TINY, "--max-steps", 4, "--out", run)
    before = parameters(run)
    real_replace = os.replace

    def interrupted_rename(src, dst):
        if os.path.basename(dst) == "checkpoint":  # the old one is already moved aside
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(io.os, "replace", interrupted_rename)
    assert main(["train", "--resume", str(run), "--max-steps", "8", "--no-progress"]) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert not (run / "checkpoint").exists() and (run / ".checkpoint.old").is_dir()
    assert has_checkpoint(run) and read_meta(find_checkpoint(run))["step"] == 4
    assert_same(parameters(run), before)
    train("--resume", run, "--max-steps", 8, "--no-progress")
    assert read_meta(find_checkpoint(run))["step"] == 8


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(DistrecError, match="not found"):
        find_checkpoint(tmp_path / "nothing")
    with pytest.raises(DistrecError, match="holds no checkpoint"):
        find_checkpoint(tmp_path)
    assert not has_checkpoint(tmp_path)


def test_exported_blocks_are_views_that_save_each_storage_once(tmp_path):
    """A checkpoint save needs no copy of the tables: the blocks are views of the fused
    weight, and torch.save writes that storage once however many views it has."""
    ebc = EmbeddingBagCollection([TableConfig("a", 1_000, 8), TableConfig("b", 3_000, 8)])
    blocks = export_blocks(ebc, None)
    assert all(b["weight"].untyped_storage().data_ptr() == ebc.weight.untyped_storage().data_ptr() for b in blocks)
    torch.save(blocks, tmp_path / "blocks.pt")
    assert (tmp_path / "blocks.pt").stat().st_size < 1.1 * ebc.weight.numel() * 4
    loaded = torch.load(tmp_path / "blocks.pt", weights_only=True)
    assert torch.equal(loaded[1]["weight"], ebc.table_weight("b")) and loaded[1]["block"]["table"] == "b"
    copied = export_blocks(ebc, None, copy=True)
    assert all(c["weight"].untyped_storage().data_ptr() != ebc.weight.untyped_storage().data_ptr() for c in copied)


# --- loading runs no code; corrupt files and a full disk are one line -------------------


class MakesMarker:
    """Unpickling this runs ``touch PATH``: what a crafted checkpoint could do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def forge_meta(checkpoint, edit):
    """Apply ``edit`` (meta dict -> None) to meta.json and record its new checksum, as a forger would."""
    meta = json.loads((checkpoint / META_FILE).read_text())
    edit(meta)
    meta[META_CHECKSUM] = meta_checksum(meta)
    (checkpoint / META_FILE).write_text(json.dumps(meta))


def rewrite_checksum(checkpoint, name):
    """Record the current bytes of ``name`` in meta.json (and forget its identity), as a forger would."""
    forge_meta(checkpoint, lambda meta: (meta[CHECKSUMS].update({name: file_checksum(checkpoint / name)}), meta[IDENTITIES].pop(name, None)))


@pytest.fixture
def run(tmp_path):
    """A finished tiny run directory (4 steps)."""
    out = tmp_path / "run"
    train(*TINY, "--max-steps", 4, "--out", out)
    return out


@pytest.mark.parametrize("command", ["evaluate", "resume"])
def test_a_malicious_pickle_in_a_checkpoint_runs_no_code(tmp_path, capsys, run, command):
    marker = tmp_path / "pwned"
    torch.save({"dense": MakesMarker(marker)}, run / "checkpoint" / "state-rank0.pt")
    argv = ["evaluate", "--checkpoint", run, "--no-progress"] if command == "evaluate" else ["train", "--resume", run, "--max-steps", 8, "--no-progress"]
    assert_one_line_error(capsys, argv, "state-rank0.pt", "is corrupt", "earlier checkpoint")  # meta.json's checksum catches it first
    rewrite_checksum(run / "checkpoint", "state-rank0.pt")
    assert_one_line_error(capsys, argv, "state-rank0.pt", "pickled Python objects", "--trust-checkpoint")
    assert not marker.exists()


def test_a_checkpoint_loads_without_unpickling_code(run):
    """Every entry of a saved state (RNG states included) is plain data for weights_only."""
    for state in (run / "checkpoint").glob("state-rank*.pt"):
        own = torch.load(state, weights_only=True)
        assert torch.is_tensor(own["rng"]["torch"]) and torch.is_tensor(own["rng"]["numpy"]["keys"])


def test_an_old_pickled_checkpoint_loads_only_when_trusted(tmp_path, capsys, run):
    """Format 2 pickled NumPy's RNG state: --trust-checkpoint loads it after a warning line."""
    import random

    import numpy as np

    checkpoint = run / "checkpoint"
    own = torch.load(checkpoint / "state-rank0.pt", weights_only=True)
    own["rng"] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}  # format 2's
    torch.save(own, checkpoint / "state-rank0.pt")
    meta = json.loads((checkpoint / "meta.json").read_text())
    meta["format_version"] = 2
    for key in ("sha256", META_CHECKSUM):  # format 2 had neither
        del meta[key]
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    assert_one_line_error(capsys, ["evaluate", "--checkpoint", run, "--no-progress"], "pickled Python objects", "--trust-checkpoint")
    assert main(["evaluate", "--checkpoint", str(run), "--no-progress", "--trust-checkpoint"]) == 0
    out, err = capsys.readouterr()
    assert "auc" in json.loads(out)
    assert [line for line in err.splitlines() if line.strip()] == [
        f"distrec: warning: --trust-checkpoint: unpickling {str(checkpoint / 'state-rank0.pt')!r}, which runs any code it holds"
    ]


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path):
    path.write_bytes(b"")


def random_bytes(path):
    path.write_bytes(os.urandom(path.stat().st_size))


def overwrite_8kb(path):
    data = bytearray(path.read_bytes())
    data[-12_000:-4_000] = os.urandom(8_000)  # inside the weights, before the zip directory
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, empty, random_bytes, overwrite_8kb])
@pytest.mark.parametrize("command", ["evaluate", "resume"])
def test_a_corrupt_state_file_is_named_in_one_line(capsys, run, damage, command):
    damage(run / "checkpoint" / "state-rank0.pt")
    argv = ["evaluate", "--checkpoint", run, "--no-progress"] if command == "evaluate" else ["train", "--resume", run, "--max-steps", 8, "--no-progress"]
    assert_one_line_error(capsys, argv, str(run / "checkpoint" / "state-rank0.pt"), "is corrupt", "resume from an earlier checkpoint", "retrain")


@pytest.mark.parametrize("content", [b"", b'{"format_version": 3, "step": ', b"\xff\xfe not json", b"[1, 2]", b'{"format_version": 3}'])
def test_a_broken_meta_json_is_named_in_one_line(capsys, run, content):
    (run / "checkpoint" / "meta.json").write_bytes(content)
    assert_one_line_error(capsys, ["evaluate", "--checkpoint", run, "--no-progress"], str(run / "checkpoint" / "meta.json"), "earlier checkpoint")


def test_an_edited_meta_json_is_named_in_one_line_unless_its_checksum_entry_is_deleted(capsys, run):
    """meta.json holds the SHA-256 of its other entries: a changed value (a flipped digit) is
    caught; a checkpoint without the entry (written before it existed) loads."""
    path = run / "checkpoint" / META_FILE
    meta = json.loads(path.read_text())
    assert meta[META_CHECKSUM] == meta_checksum(meta)
    path.write_text(path.read_text().replace('"step": 4', '"step": 5'))
    assert_one_line_error(
        capsys, ["evaluate", "--checkpoint", run, "--no-progress"], str(path), f"is corrupt (its {META_CHECKSUM} differs", f"delete its {META_CHECKSUM} entry"
    )
    meta = json.loads(path.read_text())
    del meta[META_CHECKSUM]
    path.write_text(json.dumps(meta, indent=4))
    assert read_meta(find_checkpoint(run))["step"] == 5
    assert main(["evaluate", "--checkpoint", str(run), "--no-progress"]) == 0


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(capsys, run, monkeypatch):
    """torch.save on a full disk: the file system refuses a write part way (ENOSPC)."""
    import errno

    before = parameters(run)
    real_save = torch.save

    def save_until_full(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        with open(f, "r+b") as out:
            out.truncate(100)  # what fitted
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save_until_full)
    line = assert_one_line_error(
        capsys,
        ["train", *TINY, "--max-steps", 8, "--out", run, "--overwrite"],
        f"no space left to save the checkpoint {str(run / 'checkpoint')!r}",
        "MiB",
        "previous checkpoint is intact",
    )
    monkeypatch.undo()
    needed = float(line.split("needs about ")[1].split(" MiB")[0].replace(",", ""))
    assert needed * 2**20 >= 0.9 * (run / "checkpoint" / "state-rank0.pt").stat().st_size
    assert [p.name for p in run.iterdir() if p.name.startswith(".checkpoint")] == []  # the staging folder is gone
    assert read_meta(find_checkpoint(run))["step"] == 4
    assert_same(parameters(run), before)


def test_a_full_disk_at_a_hotline_runs_first_save_counts_its_rows_and_claims_no_previous_checkpoint(tmp_path, capsys, monkeypatch):
    import errno

    from distrec.hotline import tiers

    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tiers, "write_rows", disk_full)
    argv = ["train", *TINY, "--set", "data.synthetic.table_rows=2000", "--hotline", "--hot-budget", "2KB", "--max-steps", 2, "--out", tmp_path / "run"]
    line = assert_one_line_error(capsys, argv, f"no space left to save the checkpoint {str(tmp_path / 'run' / 'checkpoint')!r}", "pass another --out")
    assert "previous checkpoint" not in line  # there was none
    needed = float(line.split("needs about ")[1].split(" MiB")[0])
    assert needed * 2**20 >= 26 * 2000 * (8 + 1) * 4  # at least the rows file (1.8 MB, the rest 0.1): 26 tables of 2000 rows, dim 8 and Adagrad's row state


def test_a_file_hard_linked_from_the_last_checkpoint_keeps_its_checksum_unread(tmp_path, monkeypatch):
    """Hotline's base rows (maybe larger than RAM) are shared by hard links: a new checkpoint
    takes their checksum from the one it links from, and the result verifies."""
    from distrec.components import checkpoint

    state = {0: {"x": torch.arange(4)}}
    checkpoint.save_checkpoint(tmp_path, state, {"step": 1}, write_files=lambda d: (d / "rows.bin").write_bytes(os.urandom(4096)))
    read = []
    real = checkpoint.file_checksum
    monkeypatch.setattr(checkpoint, "file_checksum", lambda path: read.append(path.name) or real(path))
    checkpoint.save_checkpoint(tmp_path, state, {"step": 2}, write_files=lambda d: os.link(tmp_path / "checkpoint" / "rows.bin", d / "rows.bin"), name="best")
    assert read == ["state-rank0.pt"]
    assert read_meta(tmp_path / "best")["sha256"]["rows.bin"] == real(tmp_path / "best" / "rows.bin")
    read.clear()
    for name in ("checkpoint", "best"):  # no checkpoint to take it from: the file is read
        (tmp_path / name / "meta.json").unlink()
    checkpoint.save_checkpoint(tmp_path, state, {"step": 3}, write_files=lambda d: os.link(tmp_path / "best" / "rows.bin", d / "rows.bin"), name="other")
    assert read == ["rows.bin", "state-rank0.pt"]


def test_a_settled_file_is_not_read_again_while_it_keeps_its_identity(tmp_path, monkeypatch):
    """A file unchanged for a while when saved (Hotline's base rows) is verified by its identity
    (device, inode, size, mtime) at load; a write, a copy or a fresh file is read and checked."""
    from distrec.components import checkpoint

    def settled_rows(directory):
        (directory / "rows.bin").write_bytes(os.urandom(4096))
        os.utime(directory / "rows.bin", ns=(1_700_000_000 * 10**9,) * 2)

    checkpoint.save_checkpoint(tmp_path, {0: {"x": torch.arange(4)}}, {"step": 1}, write_files=settled_rows)
    rows = tmp_path / "checkpoint" / "rows.bin"
    assert list(json.loads((tmp_path / "checkpoint" / "meta.json").read_text())["file_identity"]) == ["rows.bin"]  # the state file is fresh
    read = []
    real = checkpoint.file_checksum
    monkeypatch.setattr(checkpoint, "file_checksum", lambda path: read.append(path.name) or real(path))
    assert read_meta(tmp_path / "checkpoint")["step"] == 1 and read == []
    flipped = bytes(b ^ 0xFF for b in rows.read_bytes())
    rows.write_bytes(flipped)
    with pytest.raises(DistrecError, match="rows.bin' is corrupt"):
        read_meta(tmp_path / "checkpoint")
    os.utime(rows, ns=(1_700_000_000 * 10**9,) * 2)  # the same file, size and mtime: taken as read
    read_meta(tmp_path / "checkpoint")
    copy = tmp_path / "copy.bin"
    copy.write_bytes(flipped)
    os.utime(copy, ns=(1_700_000_000 * 10**9,) * 2)
    copy.replace(rows)  # another inode, the same size and mtime (a restored copy)
    read.clear()
    with pytest.raises(DistrecError, match="rows.bin' is corrupt"):
        read_meta(tmp_path / "checkpoint")
    assert read == ["rows.bin"]


def test_a_malformed_file_identity_entry_is_one_line(tmp_path):
    from distrec.components import checkpoint

    checkpoint.save_checkpoint(tmp_path, {0: {"x": torch.arange(4)}}, {"step": 1})
    forge_meta(tmp_path / "checkpoint", lambda meta: meta.update(file_identity=[1, 2]))
    with pytest.raises(DistrecError, match="malformed file_identity; delete that entry"):
        read_meta(tmp_path / "checkpoint")
