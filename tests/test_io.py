import pytest

from distrec.io import atomic_directory, leftovers, remove_leftovers, staging_directory


def test_atomic_directory_removes_temporaries_of_killed_writes(tmp_path):
    # regression: a write killed with SIGKILL left `.NAME.<random>.tmp` behind for good
    target = tmp_path / "checkpoint"
    killed = tmp_path / ".checkpoint.a1b2c3.tmp"
    killed.mkdir()
    (killed / "state-rank0.pt").write_bytes(b"half")
    (tmp_path / ".checkpoint.x9.tmp").write_bytes(b"a half-written file")
    other = tmp_path / ".checkpoints.q.tmp"  # another target's temporary
    other.mkdir()
    with atomic_directory(target) as tmp:
        (tmp / "meta.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".checkpoints.q.tmp", "checkpoint"]
    assert (target / "meta.json").read_text() == "{}"


def test_remove_leftovers_clears_a_staging_directory_and_keeps_the_previous_copy(tmp_path):
    # the collective checkpoint save fills `.checkpoint.writing`; `.checkpoint.old` is the fallback copy
    target = tmp_path / "checkpoint"
    staging = staging_directory(target)
    assert staging == tmp_path / ".checkpoint.writing"
    staging.mkdir()
    (staging / "state-rank1.pt").write_bytes(b"x")
    (tmp_path / ".checkpoint.old").mkdir()
    assert leftovers(target) == [staging]
    assert remove_leftovers(target) == [staging]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".checkpoint.old"]
    assert remove_leftovers(target) == []


def test_a_failing_block_leaves_the_target_untouched(tmp_path):
    target = tmp_path / "d"
    target.mkdir()
    (target / "f").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "f").write_text("new")
        raise RuntimeError("killed")
    assert (target / "f").read_text() == "old" and leftovers(target) == []


def test_a_run_removes_the_temporaries_of_a_checkpoint_save_killed_earlier(tmp_path, monkeypatch, capsys):
    # regression: kill -9 during a save left `.checkpoint.*.tmp` / `.checkpoint.writing` for good
    from distrec.cli import main

    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    tiny = [
        "--preset",
        "tiny",
        "--set",
        "data.synthetic.rows=300",
        "--set",
        "data.synthetic.table_rows=50",
        "--batch-size",
        "64",
        "--max-steps",
        "2",
        "--no-progress",
    ]
    assert main(["train", *tiny, "--out", str(run)]) == 0
    killed = [run / ".checkpoint.k1ll3d.tmp", run / ".checkpoint.writing"]
    for d in killed:
        d.mkdir()
        (d / "state-rank0.pt").write_bytes(b"half")
    # the resumed run's checkpoint save (atomic_directory) clears them first
    assert main(["train", "--resume", str(run), "--max-steps", "3", "--no-progress"]) == 0
    capsys.readouterr()
    assert not any(d.exists() for d in killed) and (run / "checkpoint" / "meta.json").is_file()


def test_atomic_writes_respect_the_umask(tmp_path):
    import os

    from distrec.io import atomic_directory, atomic_path, atomic_write_json

    before = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "summary.json", {"auc": 0.5})
        with atomic_path(tmp_path / "big.bin") as tmp:
            tmp.write_bytes(b"x")
        with atomic_directory(tmp_path / "checkpoint") as d:
            (d / "meta.json").write_text("{}")
    finally:
        os.umask(before)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "big.bin").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "checkpoint").stat().st_mode & 0o777 == 0o755
