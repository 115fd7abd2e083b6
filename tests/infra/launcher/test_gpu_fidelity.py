"""Drop-in fidelity on GPU clusters: MirroredStrategyRunner as spark-tensorflow-distributor,
HorovodRunner as Databricks' documentation describe them, on a real standalone cluster with
fake GPUs (``fake_gpu_cluster``): executors of 4 GPUs, tasks of 2, a driver with 4.

The scenarios run in one driver process of their own (``gpu_scenarios``); each test below
checks one behaviour of the originals against what that process recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_for_no_ranks
from tests.infra.launcher.fake_gpu_cluster import discovery_script, fake_gpu_cluster

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


def run_scenarios(args: list[str], workdir: Path) -> dict:
    out = workdir / f"seen-{args[0]}.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.infra.launcher.gpu_scenarios", *args, str(out)],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
            "SPARK_LOCAL_IP": "127.0.0.1",
            # PySpark takes the executors' interpreter from here, not from a conf key.
            "PYSPARK_PYTHON": sys.executable,
            "HVDFLOW_HOME": str(workdir / "home"),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert wait_for_no_ranks() == []
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("fake-gpus")
    driver_gpus = discovery_script(workdir / "driver-gpus.sh", 4)
    with fake_gpu_cluster(workdir / "cluster") as master_url:
        on_gpus = run_scenarios(["gpu", master_url, str(driver_gpus)], workdir)
    return {"gpu_cluster": on_gpus, **run_scenarios(["ssl"], workdir)}


def devices(worker: dict) -> list[str]:
    return [d for d in (worker["cuda_visible_devices"] or "").split(",") if d]


@pytest.mark.parametrize(
    ("num_slots", "tasks", "per_worker"), [(3, 2, [2, 1]), (4, 2, [2, 2]), (8, 4, [2, 2, 2, 2])]
)
def test_num_slots_counts_gpus_spread_over_ceil_num_slots_over_task_gpus_tasks(
    seen, num_slots, tasks, per_worker
):
    result = seen["gpu_cluster"][f"mirrored_gpu_{num_slots}"]["ok"]
    assert result["num_tasks"] == tasks  # get_num_tasks(), public as in the original
    workers = result["workers"]
    assert [len(devices(w)) for w in workers] == per_worker
    # One MultiWorkerMirroredStrategy worker per task, each over all the GPUs it was given.
    assert all(w["tf_workers"] == tasks for w in workers)
    every = [d for w in workers for d in devices(w)]
    assert len(set(every)) == num_slots  # no GPU given twice
    assert result["chief"]["rank"] == 0 and result["same_sc"]  # runner.sc: the session's


@pytest.mark.parametrize(("key", "gathered"), [("3", [2, 1]), ("4", [2, 2]), ("cpu", [0, 0])])
def test_train_fn_gathers_across_tasks_with_the_barrier_task_context(seen, key, gathered):
    # spark-tensorflow-distributor's test_equal_gpu_allocation and test_cpu_training_with_gpus:
    # BarrierTaskContext.get().allGather in train_fn, inside the default strategy's scope.
    assert seen["gpu_cluster"][f"mirrored_gather_{key}"] == {"ok": gathered}


def test_use_gpu_false_hides_the_gpus_of_tasks_that_hold_some(seen):
    result = seen["gpu_cluster"]["mirrored_cpu_2"]["ok"]
    assert result["num_tasks"] == 2
    assert [w["cuda_visible_devices"] for w in result["workers"]] == ["", ""]


def test_more_gpus_than_the_cluster_has_fails_naming_num_slots_and_the_slots(seen):
    failure = seen["gpu_cluster"]["mirrored_too_many"]
    assert failure["error"] == "RuntimeError"
    assert failure["message"].startswith("num_slots=10 (5 Spark tasks) needs 5 task slots")
    assert (
        "has 4 after waiting 1 s" in failure["message"] and "lower num_slots" in failure["message"]
    )


def test_gpu_resource_name_is_honoured(seen):
    failure = seen["gpu_cluster"]["mirrored_other_resource"]
    assert failure["error"] == "GpuSchedulingNotEnabled"
    assert "spark.task.resource.tpu.amount is not set" in failure["message"]
    assert "use_gpu=False" in failure["message"]


def test_horovod_runner_runs_one_rank_per_gpu_on_tasks_of_several(seen):
    ranks = seen["gpu_cluster"]["horovod_3"]["ok"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2] and all(r["size"] == 3 for r in ranks)
    # Two tasks of 2 GPUs run 2 and 1 ranks; each rank sees one GPU, none shared.
    assert [len(devices(r)) for r in ranks] == [1, 1, 1]
    assert len({r["cuda_visible_devices"] for r in ranks}) == 3
    assert [r["local_rank"] for r in ranks][:2] == [0, 1]


def test_ranks_sharing_a_task_form_one_horovod_job(seen):
    result = seen["gpu_cluster"]["horovod_allreduce_4"]["ok"]
    assert result["sum"] == 0 + 1 + 2 + 3
    assert len({r["cuda_visible_devices"] for r in result["ranks"]}) == 4


def test_local_mode_is_one_process_over_num_slots_of_the_drivers_gpus(seen):
    result = seen["gpu_cluster"]["local_gpu_2"]["ok"]
    assert result["processes"] == 1 and result["seen"]["tf_workers"] == 1
    assert result["seen"]["cuda_visible_devices"] == "0,1"  # spark.driver.resource.gpu
    assert result["driver_env_after"] is None  # the driver's environment is left as it was
    visible = seen["gpu_cluster"]["local_gpu_2_visible"]["ok"]
    assert visible["seen"]["cuda_visible_devices"] == "10,11"  # the driver's own devices win
    assert visible["driver_env_after"] == "10,11,12,13"


def test_local_mode_refuses_more_gpus_than_the_driver_has_and_more_than_one_cpu(seen):
    too_many = seen["gpu_cluster"]["local_gpu_5"]
    assert too_many["error"] == "ValueError"
    assert (
        "num_slots=5 GPUs were requested for local training but the driver has 4"
        in (too_many["message"])
    )
    cpus = seen["gpu_cluster"]["local_cpu_2"]
    assert cpus["error"] == "ValueError" and "set num_slots=1" in cpus["message"]
    assert seen["gpu_cluster"]["local_cpu_1"]["ok"]["seen"]["cuda_visible_devices"] == ""


def test_a_cluster_with_ssl_is_refused_unless_the_override_conf_is_set(seen):
    refused = seen["refused"]
    for runner, override in (
        ("mirrored", "tensorflow.spark.distributor.ignoreSsl"),
        ("horovod", "databricks.horovod.ignoreSsl"),
        ("torch", "pytorch.spark.distributor.ignoreSsl"),
    ):
        assert refused[runner]["error"] == "EncryptionRequired"
        assert "spark.ssl.enabled=true" in refused[runner]["message"]
        assert f"set {override}=true" in refused[runner]["message"]
    allowed = seen["with_override"]
    assert allowed == {"mirrored": {"ok": 2}, "horovod": {"ok": 2}, "torch": {"ok": 2}}


def test_torch_distributor_runs_ceil_n_over_task_gpus_tasks_whose_processes_share_them(seen):
    # pyspark's: ceil(num_processes / spark.task.resource.gpu.amount) tasks, each process
    # seeing its task's GPUs and picking one by LOCAL_RANK (torchrun's contract). pyspark
    # starts one process per task there, with WORLD_SIZE=num_processes, which never meets.
    result = seen["gpu_cluster"]["torch_gpu_3"]["ok"]
    assert result["num_tasks"] == 2 and result["rank_0"]["rank"] == 0
    processes = result["processes"]
    assert [p["torch_world_size"] for p in processes] == ["3"] * 3
    assert [p["torch_local_rank"] for p in processes] == ["0", "1", "0"]
    assert [len(devices(p)) for p in processes] == [2, 2, 1]
    assert processes[0]["cuda_visible_devices"] == processes[1]["cuda_visible_devices"]
    assert not set(devices(processes[0])) & set(devices(processes[2]))


def test_torch_distributor_without_gpus_hides_them(seen):
    result = seen["gpu_cluster"]["torch_cpu_2"]["ok"]
    assert result["num_tasks"] == 2
    assert [p["cuda_visible_devices"] for p in result["processes"]] == ["", ""]


def test_torch_local_mode_shares_the_drivers_gpus_and_cuts_num_processes_to_them(seen):
    two = seen["gpu_cluster"]["torch_local_gpu_2"]["ok"]
    assert [p["cuda_visible_devices"] for p in two["processes"]] == ["0,1", "0,1"]
    assert [p["torch_local_rank"] for p in two["processes"]] == ["0", "1"]
    # More than the driver's 4 GPUs: cut to 4 with a warning, as the original does.
    five = seen["gpu_cluster"]["torch_local_gpu_5"]["ok"]
    assert five["num_processes"] == 4 and len(five["processes"]) == 4
    assert {p["cuda_visible_devices"] for p in five["processes"]} == {"0,1,2,3"}
