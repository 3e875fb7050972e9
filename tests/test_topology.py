import pytest

from distrec.errors import DistrecError
from distrec.parallel.topology import Topology


def test_host_local_rank_and_peers_follow_host_major_numbering():
    t = Topology(hosts=3, ranks_per_host=4)
    assert t.world_size == 12
    assert [t.host(g) for g in range(12)] == [0] * 4 + [1] * 4 + [2] * 4
    assert [t.local_rank(g) for g in range(12)] == [0, 1, 2, 3] * 3
    assert t.peers(6) == [2, 6, 10]
    assert t.host_ranks(1) == [4, 5, 6, 7]
    assert all(t.rank(t.host(g), t.local_rank(g)) == g for g in range(12))


def test_peer_order_sorts_by_local_rank_then_host():
    t = Topology(hosts=2, ranks_per_host=3)
    assert t.peer_order == [0, 3, 1, 4, 2, 5]
    assert sorted(t.peer_order, key=lambda g: (t.local_rank(g), t.host(g))) == t.peer_order
    assert Topology(4, 1).peer_order == [0, 1, 2, 3]
    assert Topology(1, 4).peer_order == [0, 1, 2, 3]


def test_out_of_range_ranks_are_rejected():
    t = Topology(2, 2)
    with pytest.raises(IndexError):
        t.host(4)
    with pytest.raises(IndexError):
        t.rank(2, 0)


@pytest.mark.parametrize("hosts,ranks", [(0, 2), (2, 0), (-1, 1)])
def test_invalid_sizes_raise_distrec_error(hosts, ranks):
    with pytest.raises(DistrecError, match="at least 1"):
        Topology(hosts, ranks)


def test_check_world_size():
    Topology(2, 3).check_world_size(6)
    with pytest.raises(DistrecError, match="needs 6 ranks"):
        Topology(2, 3).check_world_size(4)


def test_from_env_reads_torchrun_variables():
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "5", "LOCAL_RANK": "1"}
    assert Topology.from_env(env) == Topology(hosts=2, ranks_per_host=4)
    assert Topology.from_env({"WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3"}) == Topology(1, 3)


@pytest.mark.parametrize(
    "env,message",
    [
        ({"LOCAL_WORLD_SIZE": "4"}, "WORLD_SIZE is not set"),
        ({"WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE is not set"),
        ({"WORLD_SIZE": "eight", "LOCAL_WORLD_SIZE": "4"}, "not an integer"),
        ({"WORLD_SIZE": "0", "LOCAL_WORLD_SIZE": "4"}, "out of range"),
        ({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"}, "not a multiple"),
        ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "5", "LOCAL_RANK": "2"}, "host-major"),
    ],
)
def test_from_env_errors_name_the_problem(env, message):
    with pytest.raises(DistrecError, match=message):
        Topology.from_env(env)
