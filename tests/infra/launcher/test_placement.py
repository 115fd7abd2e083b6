import pytest

from infra import constants as c
from infra.launcher._placement import (
    RankSlot,
    gloo_iface_for,
    gpu_for_rank,
    host_of,
    plan_ranks,
    rank_env,
)

pytestmark = pytest.mark.unit


def test_host_of_strips_the_port_and_ipv6_brackets():
    assert host_of("127.0.0.1:40123") == "127.0.0.1"
    assert host_of("[::1]:40123") == "::1"
    assert host_of("worker-7") == "worker-7"


def test_two_tasks_on_one_host_are_local_ranks_of_one_cross_group():
    slots = plan_ranks(["10.0.0.1", "10.0.0.1"])
    assert slots == [
        RankSlot(0, 2, 0, 2, 0, 1, "10.0.0.1"),
        RankSlot(1, 2, 1, 2, 0, 1, "10.0.0.1"),
    ]


def test_interleaved_hosts_get_ranks_host_by_host():
    # Partitions alternate hosts; Horovod numbers ranks host by host.
    slots = plan_ranks(["a", "b", "a", "b"])
    assert [(s.rank, s.local_rank, s.cross_rank, s.hostname) for s in slots] == [
        (0, 0, 0, "a"),
        (2, 0, 1, "b"),
        (1, 1, 0, "a"),
        (3, 1, 1, "b"),
    ]
    assert {s.size for s in slots} == {4}
    assert {s.cross_size for s in slots} == {2}


def test_rank_env_holds_the_full_horovod_environment():
    env = rank_env(
        RankSlot(1, 2, 1, 2, 0, 1, "127.0.0.1"),
        rendezvous_addr="127.0.0.1",
        rendezvous_port=4321,
        gloo_iface="lo",
        options_env={c.HOROVOD_CYCLE_TIME: "5"},
        run_id="abc",
        gpu="1",
    )
    assert env == {
        "HOROVOD_RANK": "1",
        "HOROVOD_SIZE": "2",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "0",
        "HOROVOD_CROSS_SIZE": "1",
        "HOROVOD_HOSTNAME": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321",
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": "lo",
        "HVDFLOW_RUN_ID": "abc",
        "HOROVOD_CYCLE_TIME": "5",
        "CUDA_VISIBLE_DEVICES": "1",
    }


def test_each_rank_sees_only_its_local_ranks_gpu():
    assert gpu_for_rank(0, ["0", "1"]) == "0"
    assert gpu_for_rank(1, ["0", "1"]) == "1"
    assert gpu_for_rank(1, ["3"]) == "3"  # Spark gave this task one GPU: that one
    assert gpu_for_rank(0, []) is None


def test_loopback_address_maps_to_the_loopback_interface():
    assert gloo_iface_for("127.0.0.1") == "lo"
