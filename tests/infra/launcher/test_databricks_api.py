"""HorovodRunner against Databricks' documented ``sparkdl.HorovodRunner``, one test per behaviour
the documentation states (docs/drop-in.md's table lists them, with where each is tested).

Behaviours tested elsewhere: np > 0 waits for slots and fails when the cluster has fewer
(``test_runner::test_np_larger_than_the_cluster_fails_fast_naming_np_and_slots``); np < 0 runs
-np processes on the driver (``test_runner::test_np_negative_runs_ranks_on_the_driver...``);
rank 0's value comes back (``test_runner::test_rank_zero_return_value_comes_back...``); one
process per GPU on GPU clusters (``test_gpu_fidelity``).
"""

from __future__ import annotations

import json
import sys

import cloudpickle
import pytest

from hvdflow import GpuSchedulingNotEnabled, HorovodRunner, LaunchOptions, MirroredStrategyRunner
from hvdflow.infra.launcher._wire import LOG_TO_DRIVER_CHARS, TRUNCATED_SUFFIX

cloudpickle.register_pickle_by_value(sys.modules[__name__])

RANKS_LOGGER = "hvdflow.infra.launcher.runner.ranks"


def load_events(path: str) -> list[dict]:
    """A Horovod timeline's events (a Chrome trace); one cut off mid-write still reads."""
    text = open(path).read().strip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


@pytest.mark.unit
def test_arguments_are_keyword_only_and_np_0_is_refused_as_deprecated():
    with pytest.raises(TypeError):
        HorovodRunner(2)  # Databricks' signature: HorovodRunner(*, np, driver_log_verbosity)
    with pytest.raises(ValueError, match="np=0, every task slot, was deprecated by Databricks"):
        HorovodRunner(np=0)


def talk():
    from hvdflow import log_to_driver

    print("plain output", flush=True)
    log_to_driver("from the callback")
    log_to_driver("x" * 5000)


@pytest.mark.integration
@pytest.mark.parametrize("verbosity", ["log_callback_only", "all"])
def test_driver_log_verbosity_and_log_to_driver_as_documented(caplog, verbosity):
    with caplog.at_level("INFO", logger=RANKS_LOGGER):
        runner = HorovodRunner(np=-1, driver_log_verbosity=verbosity)
        runner.run(talk)
    shown = [r.getMessage() for r in caplog.records if r.name == RANKS_LOGGER]
    cut = "[1,0]<log>:" + "x" * LOG_TO_DRIVER_CHARS + TRUNCATED_SUFFIX  # "truncated at 4000"
    if verbosity == "log_callback_only":  # "only stream selected logs": log_to_driver's
        assert shown == ["[1,0]<log>:from the callback", cut]
    else:  # "streams all logs to the driver"
        assert shown == ["[1,0]<stdout>:plain output", "[1,0]<log>:from the callback", cut]
    # Either way, the whole output is kept in the run's log file.
    assert "[1,0]<stdout>:plain output" in open(runner.log_path).read()


def reduce_once():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    return float(hvd.allreduce(tf.constant(1.0)).numpy())


@pytest.mark.integration
def test_horovod_timeline_set_on_the_driver_records_a_timeline(tmp_path, monkeypatch, caplog):
    # Databricks: "set the HOROVOD_TIMELINE environment variable to the location where you
    # want to save the timeline file", in the notebook, before run().
    timeline = tmp_path / "horovod_timeline.json"
    monkeypatch.setenv("HOROVOD_TIMELINE", str(timeline))
    with caplog.at_level("WARNING"):
        assert HorovodRunner(np=-2).run(reduce_once) == 1.0
    events = load_events(str(timeline))
    # The whole allreduce, begun and ended: Horovod's own shutdown drops the writer's queue, so
    # a main that returns right after its collective lost the end of its timeline, or all of it.
    assert [e.get("name") for e in events if e.get("ph") == "B"] == [
        "NEGOTIATE_ALLREDUCE",
        "ALLREDUCE",
        "GLOO_ALLREDUCE",
    ]
    assert sum(e.get("ph") == "E" for e in events) == 3
    assert "Horovod timeline enabled" in caplog.text  # and its cost is named


@pytest.mark.integration
@pytest.mark.current
def test_use_gpu_on_a_cluster_without_gpu_scheduling_is_refused_as_the_original_does(spark):
    # spark-tensorflow-distributor raises when spark.task.resource.gpu.amount is unset.
    with pytest.raises(GpuSchedulingNotEnabled, match="spark.task.resource.gpu.amount"):
        MirroredStrategyRunner(num_slots=2, options=LaunchOptions(spark=spark))
    runner = MirroredStrategyRunner(num_slots=2, use_gpu=False, options=LaunchOptions(spark=spark))
    assert runner.get_num_tasks() == 2 and runner.sc is spark.sparkContext
