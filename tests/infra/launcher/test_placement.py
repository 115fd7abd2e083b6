import os

import pytest

from hvdflow.infra import constants as c
from hvdflow.infra.launcher import _engines
from hvdflow.infra.launcher._engines import (
    CPU_CYCLE_TIME_MS,
    RankSlot,
    cores_for,
    describe_rank,
    gloo_iface_for,
    gpu_for_rank,
    gpus_owned,
    has_installed_pyspark,
    host_alloc_plan,
    host_of,
    hostname_problem,
    plan_ranks,
    rank_env,
    rank_hosts,
    rank_python_path,
    split_evenly,
    worker_gpus,
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


@pytest.mark.parametrize(
    "hosts",
    [
        ["a"],
        ["a", "a"],
        ["a", "b", "a", "b"],
        ["a", "a", "a", "b", "c", "c"],
        ["c", "b", "a", "b", "c", "c", "c"],
    ],
)
def test_the_plan_is_horovods_own_allocation(hosts):
    # Ours is pure Python (no Horovod in the current profile); Horovod's rendezvous server and
    # Gloo controller must still see the slots its own get_host_assignments would give.
    hvd_hosts = pytest.importorskip("horovod.runner.common.util.hosts")
    counts = {h: hosts.count(h) for h in dict.fromkeys(hosts)}
    theirs = hvd_hosts.get_host_assignments(
        [hvd_hosts.HostInfo(h, n) for h, n in counts.items()], len(hosts), len(hosts)
    )
    assert host_alloc_plan(hosts) == [
        RankSlot(s.rank, s.size, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.hostname)
        for s in theirs
    ]


def env_of(slot: RankSlot, options_env: dict, gpu: str | None) -> dict:
    """rank_env on loopback with a fixed run id."""
    return rank_env(
        slot,
        gloo_iface="lo",
        options_env=options_env,
        run_id="abc",
        gpu=gpu,
    )


def test_rank_env_holds_the_full_horovod_environment(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = env_of(RankSlot(1, 2, 1, 2, 0, 1, "127.0.0.1"), {c.HOROVOD_CYCLE_TIME: "5"}, gpu="1")
    assert env == {
        "HOROVOD_RANK": "1",
        "HOROVOD_SIZE": "2",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "0",
        "HOROVOD_CROSS_SIZE": "1",
        "HOROVOD_HOSTNAME": "127.0.0.1",
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": "lo",
        "HVDFLOW_RUN_ID": "abc",
        "HOROVOD_CYCLE_TIME": "5",
        "CUDA_VISIBLE_DEVICES": "1",
    }


def test_a_rank_without_a_gpu_negotiates_every_10_ms_unless_someone_chose(monkeypatch, tmp_path):
    slot = RankSlot(0, 1, 0, 1, 0, 1, "127.0.0.1")
    monkeypatch.delenv(c.HOROVOD_CYCLE_TIME, raising=False)
    device = tmp_path / "nvidiactl"
    monkeypatch.setattr(_engines, "NVIDIA_DEVICE", str(device))
    assert env_of(slot, {}, gpu=None)[c.HOROVOD_CYCLE_TIME] == str(CPU_CYCLE_TIME_MS) == "10"
    # The options' choice, or the executor's own variable (inherited), wins; a GPU rank keeps
    # Horovod's default, as does a rank on a host with GPUs that Spark does not hand out.
    assert env_of(slot, {c.HOROVOD_CYCLE_TIME: "3"}, gpu=None)[c.HOROVOD_CYCLE_TIME] == "3"
    assert c.HOROVOD_CYCLE_TIME not in env_of(slot, {}, gpu="0")
    device.touch()
    assert c.HOROVOD_CYCLE_TIME not in env_of(slot, {}, gpu=None)
    device.unlink()
    monkeypatch.setenv(c.HOROVOD_CYCLE_TIME, "2")
    assert c.HOROVOD_CYCLE_TIME not in env_of(slot, {}, gpu=None)


def test_a_rank_without_a_gpu_is_bound_to_its_share_of_cores_unless_someone_chose(
    monkeypatch, tmp_path
):
    slot = RankSlot(1, 2, 1, 2, 0, 1, "127.0.0.1")
    monkeypatch.delenv(c.HVDFLOW_BIND_TO_CORES, raising=False)
    device = tmp_path / "nvidiactl"
    monkeypatch.setattr(_engines, "NVIDIA_DEVICE", str(device))
    assert env_of(slot, {}, gpu=None)[c.HVDFLOW_BIND_TO_CORES] == "1"
    assert env_of(slot, {c.HVDFLOW_BIND_TO_CORES: "0"}, gpu=None)[c.HVDFLOW_BIND_TO_CORES] == "0"
    assert c.HVDFLOW_BIND_TO_CORES not in env_of(slot, {}, gpu="0")
    device.touch()
    assert c.HVDFLOW_BIND_TO_CORES not in env_of(slot, {}, gpu=None)
    device.unlink()
    monkeypatch.setenv(c.HVDFLOW_BIND_TO_CORES, "0")  # the executor's own: inherited
    assert c.HVDFLOW_BIND_TO_CORES not in env_of(slot, {}, gpu=None)


@pytest.mark.parametrize(
    ("local_size", "allowed", "expected"),
    [
        (2, [0, 1], [[0], [1]]),
        (2, [0, 1, 2], [[0], [1, 2]]),  # the remainder to the later rank
        (3, [4, 5, 6, 7, 8, 9, 10, 11], [[4, 5], [6, 7, 8], [9, 10, 11]]),
        (2, [3, 1, 2, 0], [[0, 1], [2, 3]]),  # in core order, whatever order the set came in
        (1, [0, 1], [None]),  # one rank keeps every core
        (4, [0, 1], [None] * 4),  # more ranks than cores: left to the scheduler
    ],
)
def test_the_ranks_of_a_host_split_its_cores_into_disjoint_blocks(local_size, allowed, expected):
    assert [cores_for(r, local_size, allowed) for r in range(local_size)] == expected


SPARK_LIB = "/opt/spark/python/lib"
TASK_PATH = os.pathsep.join(
    [f"{SPARK_LIB}/pyspark.zip", "/work/deps.zip", f"{SPARK_LIB}/py4j-0.10.9.9-src.zip", "/code"]
)


def test_a_ranks_python_path_drops_only_sparks_zips_and_only_where_pyspark_is_installed():
    assert rank_python_path(TASK_PATH, has_pyspark=True) == os.pathsep.join(
        ["/work/deps.zip", "/code"]
    )
    assert rank_python_path(TASK_PATH, has_pyspark=False) == TASK_PATH  # the zip is its pyspark
    assert rank_python_path(f"{SPARK_LIB}/pyspark.zip", has_pyspark=True) == ""  # read as unset
    assert rank_python_path("/code/mypyspark.zip", has_pyspark=True) == "/code/mypyspark.zip"
    assert rank_python_path("", has_pyspark=True) == ""


def test_a_rank_gets_its_tasks_python_path_without_sparks_zips_unless_the_options_set_one(
    monkeypatch,
):
    assert has_installed_pyspark()  # hvdflow requires pyspark: its Python has it
    slot = RankSlot(0, 1, 0, 1, 0, 1, "127.0.0.1")
    monkeypatch.setenv("PYTHONPATH", TASK_PATH)
    assert env_of(slot, {}, gpu=None)["PYTHONPATH"] == os.pathsep.join(["/work/deps.zip", "/code"])
    assert env_of(slot, {"PYTHONPATH": "/mine"}, gpu=None)["PYTHONPATH"] == "/mine"
    monkeypatch.setenv("PYTHONPATH", "/code")
    assert "PYTHONPATH" not in env_of(slot, {}, gpu=None)  # nothing to change: the task's own
    monkeypatch.delenv("PYTHONPATH")
    assert "PYTHONPATH" not in env_of(slot, {}, gpu=None)


def test_gpus_hidden_in_the_options_stay_hidden_on_a_task_that_holds_one():
    # HorovodOptions(extra_env={'CUDA_VISIBLE_DEVICES': ''}) on a cluster whose tasks hold GPUs.
    env = env_of(RankSlot(0, 1, 0, 1, 0, 1, "127.0.0.1"), {c.CUDA_VISIBLE_DEVICES: ""}, gpu="0")
    assert env[c.CUDA_VISIBLE_DEVICES] == ""


def test_tasks_of_several_gpus_run_consecutive_rank_slots_on_their_host():
    hosts = rank_hosts(["10.0.0.1", "10.0.0.2"], split_evenly(3, 2))
    assert hosts == ["10.0.0.1", "10.0.0.1", "10.0.0.2"]
    assert [s.rank for s in plan_ranks(hosts)] == [0, 1, 2]
    assert [s.local_rank for s in plan_ranks(hosts)] == [0, 1, 0]
    assert rank_hosts(["a", "b"], None) == ["a", "b"]
    assert split_evenly(7, 3) == [3, 2, 2] and split_evenly(4, 2) == [2, 2]


def test_a_task_uses_its_executors_visible_devices_where_the_cluster_set_them():
    assert gpus_owned(None, ["0", "1"]) == ["0", "1"]
    assert gpus_owned("10,11", ["0", "1"]) == ["10", "11"]
    assert gpus_owned("", ["0"]) == []  # an executor with its GPUs hidden has none
    assert worker_gpus(2, ["4", "5"]) == "4,5" and worker_gpus(0, ["4"]) == ""
    with pytest.raises(ValueError, match=r"needs 3 GPU\(s\) but its task holds 2 \(4, 5\)"):
        worker_gpus(3, ["4", "5"])


def test_each_rank_sees_only_its_local_ranks_gpu():
    assert gpu_for_rank(0, ["0", "1"]) == "0"
    assert gpu_for_rank(1, ["0", "1"]) == "1"
    assert gpu_for_rank(1, ["3"]) == "3"  # Spark gave this task one GPU: that one
    assert gpu_for_rank(0, []) is None


def test_loopback_address_maps_to_the_loopback_interface():
    assert gloo_iface_for("127.0.0.1") == "lo"


def test_a_rank_is_named_with_its_host_and_address():
    assert describe_rank(1, "hvd-host2", "10.77.0.12") == "rank 1 on hvd-host2 (10.77.0.12)"
    assert describe_rank(0, "10.77.0.11", "10.77.0.11") == "rank 0 on 10.77.0.11"
    assert describe_rank(3, "", "10.0.0.4") == "rank 3 on 10.0.0.4"


TWO_HOSTS = ["10.77.0.11", "10.77.0.12"]


@pytest.mark.parametrize(
    "plan_hosts, resolved",
    [
        (TWO_HOSTS, "10.77.0.12"),  # resolves to its own address: what Gloo needs
        (TWO_HOSTS, "192.168.1.5"),  # another real address: not loopback, left to the network
        (["127.0.0.1", "127.0.0.1"], "127.0.1.1"),  # one host: Gloo never leaves it
        (["10.77.0.12"], None),
    ],
)
def test_a_hostname_is_fine_when_it_resolves_to_a_real_address_or_the_plan_has_one_host(
    plan_hosts, resolved
):
    assert hostname_problem(plan_hosts, "hvd-host2", resolved, "10.77.0.12") is None


@pytest.mark.parametrize("resolved", ["127.0.0.1", "127.0.1.1", "::1"])
def test_a_hostname_that_resolves_to_loopback_on_a_multi_host_plan_says_how_to_fix_it(resolved):
    assert hostname_problem(TWO_HOSTS, "hvd-host2", resolved, "10.77.0.12") == (
        f"host hvd-host2 resolves to {resolved}; Gloo peers on other hosts would be told to "
        "connect there: map hvd-host2 to 10.77.0.12 (this executor's address) in /etc/hosts or "
        "DNS"
    )


def test_a_hostname_that_does_not_resolve_on_a_multi_host_plan_says_how_to_fix_it():
    assert hostname_problem(["a", "b", "a"], "worker-7", None, "10.0.0.7") == (
        "host worker-7 does not resolve to any address; Gloo peers on other hosts would be told "
        "to connect there: map worker-7 to 10.0.0.7 (this executor's address) in /etc/hosts or "
        "DNS"
    )
