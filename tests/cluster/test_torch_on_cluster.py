"""TorchDistributor across two hosts: a DDP function written for pyspark's, unchanged."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.cluster.driver import run_driver
from tests.helpers import wait_for_no_ranks

pytestmark = [pytest.mark.slow, pytest.mark.torch]

DRIVER = textwrap.dedent(
    """
    import json
    import cloudpickle
    from hvdflow import TorchDistributor
    from tests.infra.launcher import torch_example

    cloudpickle.register_pickle_by_value(torch_example)
    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    print(json.dumps(distributor.run(torch_example.train, epochs=2)))
    """
)


@pytest.mark.timeout(300)
def test_a_ddp_function_trains_one_process_on_each_host_with_identical_weights(
    netns_cluster, tmp_path
):
    pytest.importorskip("torch", reason="torch is not installed (the classic profile has it)")
    run = run_driver(netns_cluster, "-c", DRIVER, workdir=tmp_path, timeout_s=240)
    assert run.returncode == 0, f"{run.stderr[-4000:]}\n--- cluster:\n{netns_cluster.diagnostics()}"
    result = json.loads(run.stdout.splitlines()[-1])
    assert len(result["checksums"]) == 2 and len(set(result["checksums"])) == 1
    host1, host2 = netns_cluster.hosts
    environments = result["environments"]
    # Rank 0's host is the rendezvous; each host is one torchrun node of one process.
    assert {e["MASTER_ADDR"] for e in environments} <= {host1.ip, host2.ip}
    assert len({e["MASTER_ADDR"] for e in environments}) == 1
    assert sorted(e["GROUP_RANK"] for e in environments) == ["0", "1"]
    assert {e["LOCAL_RANK"] for e in environments} == {"0"}
    # One-core hosts: one thread each.
    assert {e["OMP_NUM_THREADS"] for e in environments} == {"1"}
    # Every process's output is printed on the driver's stdout, tagged, as pyspark's prints it.
    assert "[1,1]<stdout>:epoch 2 done" in run.stdout
    assert wait_for_no_ranks() == []
