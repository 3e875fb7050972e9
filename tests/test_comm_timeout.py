"""A rank that stops taking part fails its peers' collectives after the configured timeout,
with one line naming it (real 2-process gloo group)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distrec.errors import DistrecError
from distrec.parallel.comm import _timed_out, device_options, free_port, init_from_env, naming_silent_ranks

TIMEOUT_SECONDS = 2.0


def _rank(rank: int, port: int, done, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    init_from_env(torch.device("cpu"), timeout_seconds=TIMEOUT_SECONDS)
    try:
        if rank == 1:  # goes silent: takes part in no collective until rank 0 has given up
            done.wait(120)
            results.put((rank, "silent"))
            return
        with naming_silent_ranks(TIMEOUT_SECONDS):
            dist.all_reduce(torch.ones(3))
        results.put((rank, "no error"))
    except DistrecError as e:
        results.put((rank, str(e)))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        results.put((rank, f"{type(e).__name__}: {e}"))
    finally:
        results.close()
        results.join_thread()  # flushed before the hard exit
        done.set()
        os._exit(0)  # the group is broken: no teardown handshake with the silent peer


def test_a_silent_rank_is_named_after_the_timeout():
    ctx = mp.get_context("spawn")
    done, results = ctx.Event(), ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, done, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    assert got[1] == "silent"
    message = got[0]
    assert "\n" not in message and message.startswith("rank 0 waited 2 s for rank 1,"), message
    assert "--timeout-seconds" in message


def test_a_timeout_must_be_positive(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(DistrecError, match="must be positive"):
        init_from_env(torch.device("cpu"), timeout_seconds=0)


@pytest.mark.parametrize(
    "message",
    [
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1000ms for recv operation to complete",
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600027 milliseconds before timing out.",
    ],
)
def test_gloo_and_nccl_timeouts_are_both_recognised(message):
    assert _timed_out(RuntimeError(message)) and not _timed_out(RuntimeError("connection reset by peer"))


def test_a_cpu_group_takes_no_device_options():
    assert device_options(torch.device("cpu")) == {}
