"""The object store relay across hosts: two ranks, one per host, whose tasks reach the driver
only through the cluster's bucket (``LaunchOptions(relay="always")``); a rank SIGKILLed behind
it is named with its host, and nothing is left in the bucket or on the hosts."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.cluster.driver import run_driver
from tests.helpers import wait_for_no_ranks

pytestmark = pytest.mark.slow

RELAY_DRIVER = textwrap.dedent(
    """
    import json, sys
    from hvdflow import HorovodRunner, LaunchOptions, RankFailed

    def main(kill_rank_1):
        import os, signal, socket
        rank = int(os.environ["HOROVOD_RANK"])
        print(f"rank {rank} on {socket.gethostname()}", flush=True)
        if kill_rank_1 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return socket.gethostname()

    options = LaunchOptions(engine="tf_collective", relay="always", slot_wait_s=90)
    answer = {}
    runner = HorovodRunner(np=2, options=options)
    answer["host"] = runner.run(main, kill_rank_1=False)
    answer["log"] = open(runner.log_path).read()
    try:
        HorovodRunner(np=2, options=options).run(main, kill_rank_1=True)
    except RankFailed as e:
        answer["error"], answer["transient"] = str(e), e.transient
    print("ANSWER " + json.dumps(answer), flush=True)
    """
)


def test_ranks_on_two_hosts_reach_the_driver_through_the_bucket_and_a_killed_one_is_named(
    netns_cluster, cluster_services, tmp_path
):
    from hvdflow.infra._env import temporary_env
    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

    _home, env, _good = cluster_services
    aws = {k: env[k] for k in env if k.startswith("AWS_")}
    run = run_driver(
        netns_cluster,
        "-c",
        RELAY_DRIVER,
        workdir=tmp_path / "driver",
        timeout_s=400,
        env={**aws, "HVDFLOW_BUCKET": "hvdflow", "HVDFLOW_PREFIX": "relay-test"},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("ANSWER "))
    answer = json.loads(line.removeprefix("ANSWER "))
    hosts = sorted(host.name for host in netns_cluster.hosts)
    assert answer["host"] in hosts
    # Both ranks' lines came through the bucket, one rank on each host.
    printed = [
        ln.split("<stdout>:")[1] for ln in answer["log"].splitlines() if "<stdout>:rank " in ln
    ]
    assert sorted(p.split(" on ")[1] for p in printed) == hosts, printed
    # A rank killed behind the relay: its task saw it die and said so, through the bucket.
    first = answer["error"].splitlines()[0]
    assert first.startswith("HorovodRunner np=2: rank 1 on "), first
    assert "was killed by SIGKILL (exit -9)" in first
    assert answer["transient"]  # the training step's retry resumes from the checkpoint
    with temporary_env(aws):
        store = ObjectStore(ObjectStoreConfig.from_env(bucket="hvdflow", prefix="relay-test"))
        assert store.list_keys("relay-test/") == []
    assert wait_for_no_ranks(30) == []
