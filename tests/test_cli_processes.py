"""The command line's process behaviour: an earlier run is never overwritten silently, a
worker's error or death reaches the user once, Ctrl-C and SIGTERM end a run with one line
and an intact checkpoint, workers do not outlive a killed launcher, bad process options are
one line, and a run says in one line each where it writes, that it reshards, and why it
restarts."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from distrec.cli import main
from distrec.cli.failures import LAUNCHER_LOGGER, announcing_restarts, killed_rank
from distrec.cli.orphans import LAUNCHER_PID_ENV
from distrec.cli.train import holding_run
from distrec.components.checkpoint import find_checkpoint, read_meta
from distrec.train.evaluate import load_trained_model
from launched import running, wait_until_gone, workers_of
from test_cli import ANNOUNCED_OPTIMIZERS, ANNOUNCED_RUN, assert_one_line_error

CHOSEN_OPTIMIZERS = (
    f"{ANNOUNCED_OPTIMIZERS}adam (lr 0.001) for the dense layers and row-wise adagrad (lr 0.03) for the embedding rows (--optimizer and --lr to choose)"
)
TINY = ["--preset", "tiny", "--set", "data.synthetic.rows=600", "--set", "data.synthetic.table_rows=50", "--batch-size", "64", "--no-progress"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))


def stderr_lines(stderr):
    return [line for line in stderr.splitlines() if line.strip()]


def stopped_with_one_line(proc, out, returncode, message):
    """Wait for the training run ``proc`` into ``out``: it ends with ``returncode``, and after
    its two start-up lines its stderr is the one line ``message(step)``, ``step`` being its
    checkpoint's; returns that step."""
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == returncode
    step = read_meta(find_checkpoint(out))["step"]
    assert stderr_lines(stderr) == [CHOSEN_OPTIMIZERS, f"{ANNOUNCED_RUN}{out}", message(step)]
    return step


def test_reusing_out_is_refused_unless_overwrite(capsys, tmp_path):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--max-steps", "2", "--out", str(run)]) == 0
    capsys.readouterr()
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    assert_one_line_error(
        capsys, ["train", *TINY, "--max-steps", 3, "--out", run], f"--out {str(run)!r} already holds files", "checkpoint", "--resume", "--overwrite"
    )
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before  # nothing touched
    assert main(["train", *TINY, "--max-steps", "3", "--out", str(run), "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 3
    assert_one_line_error(capsys, ["train", "--resume", run, "--overwrite", "--max-steps", 4], "--overwrite cannot change a resumed run")
    assert_one_line_error(capsys, ["train", *TINY, "--max-steps", 3, "--out", run / "config.yaml"], "is a file")


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["train", "--max-restarts", "-1"], ["--max-restarts is -1", "at least 0"]),
        (["train", "--nproc-per-node", "0"], ["--nproc-per-node is 0", "at least 1"]),
        (["train", "--timeout-seconds", "0"], ["--timeout-seconds is 0.0", "positive"]),
        (["train", "--trust-checkpoint"], ["--trust-checkpoint", "--resume DIR"]),
        (["evaluate", "--checkpoint", "any", "--batch-size", "0"], ["--batch-size is 0", "at least 1"]),
    ],
)
def test_bad_process_options_are_one_line(capsys, tmp_path, monkeypatch, argv, fragments):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(capsys, [*argv, "--no-progress"], *fragments)
    assert not (tmp_path / "runs").exists()  # refused before a run directory is made


def distrec(*argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "distrec", *map(str, argv)], capture_output=True, text=True, env=ENV, timeout=300, **kwargs)


def test_a_worker_error_is_printed_once_by_the_launcher(tmp_path):
    """Rank 1 finds its state corrupt on resume; rank 0 then loses its peer. The user sees
    rank 1's line once: no per-rank repeats, no launcher logs, no tracebacks."""
    run = tmp_path / "run"
    done = distrec("train", *TINY, "--max-steps", 4, "--nproc-per-node", 2, "--out", run)
    assert done.returncode == 0, done.stderr
    state = run / "checkpoint" / "state-rank1.pt"
    state.write_bytes(state.read_bytes()[:100])
    resumed = distrec("train", "--resume", run, "--max-steps", 8, "--nproc-per-node", 2, "--no-progress")
    assert resumed.returncode == 2
    announced = "distrec: resuming from step"  # rank 0 loaded its own state before rank 1 failed
    assert [line for line in stderr_lines(resumed.stderr) if not line.startswith(announced)] == [
        f"distrec: error: checkpoint file {str(state)!r} is corrupt (its checksum differs from the one saved); "
        "resume from an earlier checkpoint (a copy of the run directory) or retrain"
    ]


def start_training(out, *argv, progress=False):
    """A long training run in its own process group (as a shell starts a foreground job),
    returned once its first checkpoint is written; with ``progress``, its progress bar on."""
    tiny = TINY if not progress else [a for a in TINY if a != "--no-progress"]
    argv = ["train", *tiny, "--max-steps", "100000", "--set", "train.checkpoint_every=5", "--out", str(out), *map(str, argv)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "distrec", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True
    )
    deadline = time.monotonic() + 240
    while not (out / "checkpoint" / "meta.json").is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1]
    return proc


def test_ctrl_c_on_a_two_process_run_is_one_line_after_the_progress_bar(tmp_path):
    out = tmp_path / "run"
    proc = start_training(out, "--nproc-per-node", 2, progress=True)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches every process of the terminal's foreground group
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    bar = re.compile(r"\| \d+/\d+ \[")  # rank 0's progress bar: "  0%|    | 10/100000 [00:01<...]"
    lines = [line for line in stderr_lines(stderr) if not bar.search(line)]  # a message glued to the bar goes too
    assert len(lines) == 3 and lines[:2] == [CHOSEN_OPTIMIZERS, f"{ANNOUNCED_RUN}{out}"], stderr  # from rank 0 only
    assert lines[2].startswith("distrec: interrupted (Ctrl-C); the checkpoint of step "), stderr  # on a line of its own
    assert f"continue with 'distrec train --resume {out} --nproc-per-node 2'" in lines[2]  # as many processes as it ran on


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers in Linux's /proc")
def test_workers_stop_when_their_launcher_is_killed_and_keep_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    launcher = start_training(out, "--nproc-per-node", 2)
    workers = workers_of(launcher.pid)
    assert sorted(workers) == [0, 1]
    launcher.kill()  # kill -9: it cannot stop its workers
    launcher.communicate()
    assert wait_until_gone(workers.values()) == []
    assert read_meta(find_checkpoint(out))["world_size"] == 2
    load_trained_model(out, torch.device("cpu"))  # loads: checksums match
    with holding_run(out):  # nobody holds the run: it can be resumed
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers in Linux's /proc")
def test_a_killed_worker_is_one_line_naming_it_and_how_to_continue(tmp_path):
    """Rank 0 fails after losing its peer, with a long traceback: the launcher names the rank
    that died instead, and the resume command keeps the run's world size."""
    out = tmp_path / "run"
    launcher = start_training(out, "--nproc-per-node", 2)
    os.kill(workers_of(launcher.pid)[1], signal.SIGKILL)
    stopped_with_one_line(
        launcher,
        out,
        1,
        lambda step: (
            f"distrec: error: rank 1 died (SIGKILL); the checkpoint of step {step} in {str(out)!r} is intact: "
            f"continue with 'distrec train --resume {out} --nproc-per-node 2'"
        ),
    )


@pytest.mark.parametrize(
    "failures, cause",
    [
        ({0: (1, 100), 1: (-9, 100)}, (1, -9)),  # rank 0 reported losing its peer, seen at the same time
        ({0: (-15, 100), 1: (-6, 100)}, (1, -6)),  # rank 0 died of the launcher's SIGTERM
        ({0: (2, 100), 1: (-15, 101)}, None),  # rank 0 reported an error first
        ({0: (-9, 131), 1: (1, 100)}, None),  # rank 0 got the launcher's SIGKILL after not stopping
        ({0: (-15, 100), 1: (-15, 100)}, None),  # both stopped by the launcher
    ],
)
def test_the_killed_rank_is_the_first_seen_dead_of_a_signal_the_launcher_does_not_send(failures, cause):
    assert killed_rank(failures) == cause


PARENT = """
import os, subprocess, sys, time
from distrec.cli.orphans import LAUNCHER_PID_ENV
child = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], env={**os.environ, LAUNCHER_PID_ENV: str(os.getpid())})
print(child.pid, flush=True)
time.sleep(600)
"""
WORKER = """
import sys, time
import distrec.cli.orphans as orphans
if sys.argv[1] == "watch":
    orphans._signal_on_parent_death, orphans.WATCH_SECONDS = lambda: False, 0.05  # as without prctl
orphans.stop_with_launcher()
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the processes in Linux's /proc")
@pytest.mark.parametrize("notice", ["kernel", "watch"])
def test_a_worker_gets_sigterm_when_its_launcher_dies(notice):
    """With the kernel's parent-death signal, or a thread watching the parent where there is none."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, WORKER, notice], stdout=subprocess.PIPE, text=True, env=ENV)
    child = int(parent.stdout.readline())
    assert parent.stdout.readline().strip() == "ready"
    assert running(child)
    parent.kill()
    parent.wait()
    assert wait_until_gone([child]) == []


def test_a_worker_whose_launcher_already_died_gets_sigterm_at_once():
    """The launcher died before the worker asked to be told: the worker has another parent."""
    worker = subprocess.run([sys.executable, "-c", WORKER, "kernel"], capture_output=True, text=True, env={**ENV, LAUNCHER_PID_ENV: "1"}, timeout=120)
    assert worker.returncode == -signal.SIGTERM and worker.stdout == "", worker.stderr


def test_sigterm_says_so_and_keeps_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = start_training(out)
    proc.terminate()
    step = stopped_with_one_line(
        proc,
        out,
        143,
        lambda step: f"distrec: stopped by SIGTERM; the checkpoint of step {step} in {str(out)!r} is intact: continue with 'distrec train --resume {out}'",
    )
    load_trained_model(out, torch.device("cpu"))  # loads: checksums match
    resumed = distrec("train", "--resume", out, "--max-steps", step + 2, "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["steps"] == step + 2


def test_a_run_says_where_it_writes_and_one_process_what_it_ignores(tmp_path):
    default = distrec("train", *TINY, "--max-steps", 2, "--sharding", "column_wise", cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    (run,) = (tmp_path / "runs").iterdir()  # runs/<date-time>, picked by the command
    assert (run / "summary.json").is_file()
    assert stderr_lines(default.stderr) == [
        "ignored in one process: --sharding (multi-process settings); add --nproc-per-node N to use them",
        CHOSEN_OPTIMIZERS,
        f"{ANNOUNCED_RUN}{run.relative_to(tmp_path)}",
    ]


def test_a_resharded_resume_is_one_line(tmp_path):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--max-steps", "3", "--out", str(run)]) == 0
    resumed = distrec("train", "--resume", run, "--max-steps", 4, "--nproc-per-node", 2, "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert stderr_lines(resumed.stderr) == [
        f"distrec: resuming from step 3 of {run / 'checkpoint'}, resharded from 1 process, single to 2 processes, sharded table_wise"
    ]


def test_each_restart_of_the_workers_is_one_line_naming_the_failure(tmp_path, capsys):
    """torch's launcher logs every failed attempt; the ones it restarts after become one line
    of ours (the last is reported when it gives up, as without restarts)."""
    (tmp_path / "attempt0001-rank0").write_text("5\ndistrec: error: the loss became nan; lower the learning rate")
    launcher = logging.getLogger(LAUNCHER_LOGGER)
    failed = "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s"
    with announcing_restarts(2, tmp_path, lambda: "from step 200"):
        launcher.error(failed, -9, 1, 4242, sys.executable)  # attempt 0: killed, reported nothing
        launcher.error(failed, 1, 0, 4243, sys.executable)  # attempt 1: reported its error
        launcher.error(failed, 1, 1, 4244, sys.executable)  # attempt 2: the launcher gives up
    launcher.info("not ours")
    assert capsys.readouterr().err.splitlines() == [
        "distrec: rank 1 died (SIGKILL); restarting from step 200 (restart 1 of 2)",
        "distrec: rank 0 failed: the loss became nan; lower the learning rate; restarting from step 200 (restart 2 of 2)",
    ]
    assert not launcher.filters


def test_ctrl_c_before_any_checkpoint_finishes_the_step_saves_and_resumes(tmp_path):
    """No checkpoint is due by step count or time: the signal itself saves one."""
    out = tmp_path / "run"
    argv = ["train", *TINY, "--max-steps", "100000", "--set", "train.log_every=1", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "distrec", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True
    )
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 3) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (out / "checkpoint").exists()
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    step = read_meta(find_checkpoint(out))["step"]
    assert step >= 3 and stderr_lines(stderr)[-1] == (
        f"distrec: interrupted (Ctrl-C); the checkpoint of step {step} in {str(out)!r} is intact: continue with 'distrec train --resume {out}'"
    )
    resumed = distrec("train", "--resume", out, "--max-steps", step + 2, "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["steps"] == step + 2
