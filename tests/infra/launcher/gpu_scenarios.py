"""The runners on a Spark cluster whose tasks hold (fake) GPUs, as their original users run them.

``python -m tests.infra.launcher.gpu_scenarios {gpu MASTER_URL DRIVER_GPU_SCRIPT|ssl} OUT_JSON``
runs the scenarios of ``test_gpu_fidelity`` in a driver process of their own (a Python process
holds one SparkContext, and the test session already has one), records what the workers saw (their
CUDA_VISIBLE_DEVICES and rank variables, printed to the run's log) or the error raised, and
writes it all as JSON. The test asserts; this only observes.

GPUs are faked as Spark's own tests fake them: discovery scripts that print addresses, so the
scheduling, the task resources and the runners' choices are real and only CUDA is absent.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import cloudpickle
from pyspark.sql import SparkSession

from hvdflow import HorovodRunner, LaunchOptions, MirroredStrategyRunner, TorchDistributor

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MARKER = "SEEN "
GPUS_PER_TASK = 2


def report_what_this_worker_sees():
    """The train_fn: print what this worker was given; return the same (the chief's comes back)."""
    import json
    import os

    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    seen = {
        "rank": int(os.environ.get("HOROVOD_RANK", "-1")),
        "local_rank": int(os.environ.get("HOROVOD_LOCAL_RANK", "-1")),
        "size": int(os.environ.get("HOROVOD_SIZE", "-1")),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "tf_workers": len(tf_config.get("cluster", {}).get("worker", [])),
        # torchrun's, where the torch engine set them (TorchDistributor)
        "torch_local_rank": os.environ.get("LOCAL_RANK"),
        "torch_world_size": os.environ.get("WORLD_SIZE"),
        "pid": os.getpid(),
    }
    print("SEEN " + json.dumps(seen), flush=True)
    return seen


def allreduce_ranks():
    """A Horovod job across the ranks of multi-GPU tasks: the sum of the ranks, and the GPU."""
    import os

    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    total = hvd.allreduce(tf.constant(hvd.rank()), op=hvd.Sum)
    print(
        "SEEN "
        + json.dumps(
            {"rank": hvd.rank(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        ),
        flush=True,
    )
    return int(total.numpy())


def gather_the_gpus_of_each_task():
    """spark-tensorflow-distributor's own test_equal_gpu_allocation's train_fn, unchanged."""
    import os

    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    cuda_state = os.environ["CUDA_VISIBLE_DEVICES"]
    if cuda_state:
        num_gpus = len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))
    else:
        num_gpus = 0
    return [int(e) for e in context.allGather(str(num_gpus))]


def seen_by_workers(log_path: str) -> list[dict]:
    with open(log_path) as f:
        return sorted(
            (json.loads(line.split(MARKER, 1)[1]) for line in f if MARKER in line),
            key=lambda seen: seen["rank"],
        )


def attempt(fn) -> dict:
    """What ``fn`` returned, or the error it raised, as JSON-able values."""
    try:
        return {"ok": fn()}
    except Exception as e:
        traceback.print_exc()
        return {"error": type(e).__name__, "message": str(e)}


def on_gpu_cluster(master_url: str, driver_gpu_script: str) -> dict:
    """The cluster: executors of 4 GPUs, tasks of 2, a driver with 4 GPUs of its own."""
    spark = (
        SparkSession.builder.master(master_url)
        .appName("gpu-scenarios")
        .config("spark.executor.cores", "4")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.resource.gpu.amount", "4")
        .config("spark.task.resource.gpu.amount", str(GPUS_PER_TASK))
        .config("spark.driver.resource.gpu.amount", "4")
        .config("spark.driver.resource.gpu.discoveryScript", driver_gpu_script)
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    results: dict = {}

    def mirrored(num_slots: int, **options) -> dict:
        runner = MirroredStrategyRunner(num_slots=num_slots, use_custom_strategy=True, **options)
        chief = runner.run(report_what_this_worker_sees)
        return {
            "num_tasks": runner.get_num_tasks(),
            "same_sc": runner.sc is spark.sparkContext,
            "chief": chief,
            "workers": seen_by_workers(runner.log_path),
        }

    for num_slots in (3, 4, 8):
        results[f"mirrored_gpu_{num_slots}"] = attempt(lambda n=num_slots: mirrored(n))
    results["mirrored_cpu_2"] = attempt(lambda: mirrored(2, use_gpu=False))
    results["mirrored_too_many"] = attempt(
        lambda: mirrored(10, options=LaunchOptions(slot_wait_s=1))
    )
    results["mirrored_other_resource"] = attempt(
        lambda: MirroredStrategyRunner(num_slots=2, gpu_resource_name="tpu").get_num_tasks()
    )

    # BarrierTaskContext inside train_fn, as the original's own tests use it (its default
    # strategy included): each task's GPU count, gathered across the tasks.
    for num_slots in (3, 4):
        results[f"mirrored_gather_{num_slots}"] = attempt(
            lambda n=num_slots: MirroredStrategyRunner(num_slots=n).run(
                gather_the_gpus_of_each_task
            )
        )
    results["mirrored_gather_cpu"] = attempt(
        lambda: MirroredStrategyRunner(num_slots=2, use_gpu=False).run(gather_the_gpus_of_each_task)
    )

    def horovod(np: int) -> dict:
        runner = HorovodRunner(np=np)
        runner.run(report_what_this_worker_sees)
        return {"ranks": seen_by_workers(runner.log_path)}

    results["horovod_3"] = attempt(lambda: horovod(3))

    def horovod_job() -> dict:
        runner = HorovodRunner(np=4)
        return {"sum": runner.run(allreduce_ranks), "ranks": seen_by_workers(runner.log_path)}

    results["horovod_allreduce_4"] = attempt(horovod_job)

    def local(num_slots: int, visible: str | None = None, **options) -> dict:
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        try:
            runner = MirroredStrategyRunner(
                num_slots=num_slots, local_mode=True, use_custom_strategy=True, **options
            )
            seen = runner.run(report_what_this_worker_sees)
            return {
                "seen": seen,
                "processes": len(seen_by_workers(runner.log_path)),
                "driver_pid": os.getpid(),
                "driver_env_after": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before

    def torch(num_processes: int, **options) -> dict:
        distributor = TorchDistributor(num_processes=num_processes, **options)
        rank_0 = distributor.run(report_what_this_worker_sees)
        return {
            "num_processes": distributor.num_processes,
            "num_tasks": distributor.num_tasks,
            "rank_0": rank_0,
            "processes": seen_by_workers(distributor.log_path),
        }

    results["torch_gpu_3"] = attempt(lambda: torch(3, local_mode=False))
    results["torch_cpu_2"] = attempt(lambda: torch(2, local_mode=False, use_gpu=False))
    results["torch_local_gpu_2"] = attempt(lambda: torch(2))
    results["torch_local_gpu_5"] = attempt(lambda: torch(5))

    results["local_gpu_2"] = attempt(lambda: local(2))
    results["local_gpu_2_visible"] = attempt(lambda: local(2, visible="10,11,12,13"))
    results["local_gpu_5"] = attempt(lambda: local(5))
    results["local_cpu_1"] = attempt(lambda: local(1, use_gpu=False))
    results["local_cpu_2"] = attempt(lambda: local(2, use_gpu=False))
    spark.stop()
    return results


def on_encrypted_cluster(override: bool) -> dict:
    """A cluster with spark.ssl.enabled, with or without the runners' overrides."""
    builder = SparkSession.builder.master("local[2]").config("spark.ssl.enabled", "true")
    if override:
        builder = (
            builder.config("tensorflow.spark.distributor.ignoreSsl", "true")
            .config("databricks.horovod.ignoreSsl", "true")
            .config("pytorch.spark.distributor.ignoreSsl", "true")
        )
    spark = builder.config("spark.ui.enabled", "false").getOrCreate()
    results = {
        "mirrored": attempt(
            lambda: MirroredStrategyRunner(
                num_slots=2, use_gpu=False, use_custom_strategy=True
            ).run(report_what_this_worker_sees)["tf_workers"]
        ),
        "horovod": attempt(lambda: HorovodRunner(np=2).run(report_what_this_worker_sees)["size"]),
        "torch": attempt(
            lambda: TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
                report_what_this_worker_sees
            )["size"]
        ),
    }
    spark.stop()
    return results


def main(argv: list[str]) -> int:
    """``gpu MASTER_URL DRIVER_GPU_SCRIPT OUT`` or ``ssl OUT``: one driver process each, since
    a stopped session's conf lingers in the JVM for the next one."""
    if argv[1] == "gpu":
        results = on_gpu_cluster(argv[2], argv[3])
    else:
        results = {
            "refused": on_encrypted_cluster(override=False),
            "with_override": on_encrypted_cluster(override=True),
        }
    with open(argv[-1], "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
