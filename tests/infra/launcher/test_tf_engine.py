"""The tf_collective engine: TensorFlow's MultiWorkerMirroredStrategy on the same barrier
launcher, and spark-tensorflow-distributor's MirroredStrategyRunner on top of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

from hvdflow import HorovodRunner, LaunchOptions, MirroredStrategyRunner, RankFailed
from hvdflow.infra import extras
from hvdflow.infra.constants import HVDFLOW_EVENT_FD
from hvdflow.infra.launcher import _engines, _wire
from hvdflow.training.smoke import train_digits_tf
from tests.helpers import wait_for_no_ranks

cloudpickle.register_pickle_by_value(sys.modules[__name__])

EXAMPLE = Path(__file__).with_name("distributor_example.py")


@pytest.mark.slow
@pytest.mark.current
def test_np2_on_spark_with_the_tf_engine_ends_with_identical_weights_on_both_workers(spark):
    runner = HorovodRunner(np=2, options=LaunchOptions(spark=spark, engine="tf_collective"))
    result = runner.run(train_digits_tf, epochs=2)
    assert result["size"] == 2
    assert len(result["checksums"]) == 2 and len(set(result["checksums"])) == 1
    assert result["accuracy"] > 0.5  # it learned, as the Horovod smoke job does
    log = open(runner.log_path).read()
    assert "[1,0]<log>:Epoch 2/2 done" in log
    assert wait_for_no_ranks() == []


def worker_1_signalled_in_epoch_2(signum: int):
    import tensorflow as tf

    from hvdflow.training.engines import TF_COLLECTIVE, start_engine

    engine = start_engine(TF_COLLECTIVE)

    class SignalInEpoch2(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1 and engine.rank == 1:
                print(f"worker 1 about to get {signal.Signals(signum).name}", flush=True)
                os.kill(os.getpid(), signum)

    with engine.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(2)])
        model.compile("sgd", "mse")
    data = tf.data.Dataset.from_tensors((tf.ones((8, 4)), tf.ones((8, 2)))).repeat()
    model.fit(engine.distribute(data), epochs=50, steps_per_epoch=5, callbacks=[SignalInEpoch2()])


@pytest.mark.slow
@pytest.mark.current
def test_a_worker_crash_in_the_tf_engine_is_named_and_leaves_no_process(spark):
    runner = HorovodRunner(np=2, options=LaunchOptions(spark=spark, engine="tf_collective"))
    with pytest.raises(RankFailed) as failure:
        runner.run(worker_1_signalled_in_epoch_2, signum=signal.SIGKILL)
    message = str(failure.value)
    # The same error a Horovod rank's crash gives: the rank, its host, the signal, its output.
    assert message.startswith("HorovodRunner np=2: rank 1 on ")
    assert "was killed by SIGKILL (exit -9)" in message.splitlines()[0]
    assert "worker 1 about to get SIGKILL" in message
    assert failure.value.cause == _wire.CAUSE_SIGNAL and failure.value.transient
    assert wait_for_no_ranks() == []


@pytest.mark.slow
@pytest.mark.current
def test_a_worker_that_stops_answering_is_a_temporary_failure_that_names_it(spark):
    # TensorFlow's coordination service aborts the peers' collectives with UnavailableError
    # once a worker stops sending heartbeats (10 s): the soak cut a host's link and the run
    # failed for good, where a Horovod rank on that host is a lost rank, retried.
    runner = HorovodRunner(np=2, options=LaunchOptions(spark=spark, engine="tf_collective"))
    with pytest.raises(RankFailed) as failure:
        # SIGSTOP: as a host whose link is cut, the worker is there and says nothing.
        runner.run(worker_1_signalled_in_epoch_2, signum=signal.SIGSTOP)
    first = str(failure.value).splitlines()[0]
    assert first.startswith("HorovodRunner np=2: rank 0 on "), first
    assert "exited with code 75" in first, first
    assert "rank 1 stopped sending heartbeats" in first, first
    assert failure.value.cause == _wire.CAUSE_UNAVAILABLE and failure.value.transient
    assert wait_for_no_ranks() == []


def rank_0_returns_last(marks: str) -> None:
    import atexit
    import time

    from hvdflow.training.engines import TF_COLLECTIVE, start_engine

    engine = start_engine(TF_COLLECTIVE)
    # A worker's process ends after its atexit handlers: this one marks that moment.
    atexit.register(lambda: Path(marks, f"exited-{engine.rank}").write_text(repr(time.time())))
    if engine.rank == 0:
        time.sleep(3)  # rank 0 is still working (as if reading a peer's last tensor)
        Path(marks, "returned-0").write_text(repr(time.time()))


@pytest.mark.slow
@pytest.mark.current
def test_no_tf_worker_exits_while_another_is_still_in_main(spark, tmp_path):
    # A worker that exits as soon as it has its own result can take away a tensor a peer is
    # still reading ("Socket closed" at the final gather): the workers leave together.
    HorovodRunner(np=2, options=LaunchOptions(spark=spark, engine="tf_collective")).run(
        rank_0_returns_last, marks=str(tmp_path)
    )
    returned = float((tmp_path / "returned-0").read_text())
    assert float((tmp_path / "exited-1").read_text()) >= returned
    assert float((tmp_path / "exited-0").read_text()) >= returned
    assert wait_for_no_ranks() == []


def device_datasets_wrapped() -> list[bool]:
    """Whether each builder is wrapped: the strategy's own device datasets, the user's it
    distributes."""
    from tensorflow.python.data.ops import multi_device_iterator_ops as devices
    from tensorflow.python.distribute import distribute_lib

    distribute = distribute_lib.StrategyBase.experimental_distribute_dataset
    marks = [
        getattr(f, "hvdflow_without_autotuning", False)
        for f in (devices._create_device_dataset, distribute)
    ]
    return marks


@pytest.mark.integration
@pytest.mark.current
def test_every_tf_worker_builds_the_strategys_device_datasets_without_autotuning():
    # A user's train_fn (MirroredStrategyRunner's) never calls the pipeline's engine: the rank
    # wraps the builders when TensorFlow loads them, so neither fit's end nor an epoch's waits
    # for autotuning.
    tf_collective = HorovodRunner(np=-1, options=LaunchOptions(engine="tf_collective"))
    assert tf_collective.run(device_datasets_wrapped) == [True, True]
    if extras.installed(extras.HOROVOD):  # Horovod ranks: a user's dataset only (no strategy)
        assert HorovodRunner(np=-1).run(device_datasets_wrapped) == [False, True]


@pytest.mark.integration
@pytest.mark.current
def test_a_tf_worker_reports_its_start_when_it_creates_the_strategy_and_not_before():
    # The start timeout ends when the strategy exists; TensorFlow loads when main asks for it.
    code = (
        "import sys\n"
        "from hvdflow.infra.launcher import _engines\n"
        "_engines._report_strategy_created()\n"
        "print('tensorflow loaded:', 'tensorflow' in sys.modules, flush=True)\n"
        "import tensorflow as tf\n"
        "tf.distribute.MultiWorkerMirroredStrategy()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, HVDFLOW_EVENT_FD: "1"},  # the events, on stdout
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, *_, last = done.stdout.splitlines()
    assert first == "tensorflow loaded: False"
    assert json.loads(last)["event"] == _wire.EVENT_INIT


@pytest.mark.slow
@pytest.mark.current
def test_a_script_written_for_spark_tensorflow_distributor_runs_with_one_import_changed(
    tmp_path,
):
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "HVDFLOW_HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["workers"] == 2 and result["epochs"] == 3
    # The runner built the README's model inside its strategy, as the original does.
    assert result["strategy"] == "CollectiveAllReduceStrategy"
    assert wait_for_no_ranks() == []


@pytest.mark.unit
def test_tf_config_lists_the_endpoints_by_rank_and_names_this_worker():
    gathered = [{"rank": 1, "endpoint": "10.0.0.2:4001"}, {"rank": 0, "endpoint": "10.0.0.1:4000"}]
    assert json.loads(_engines.tf_config(gathered, 1)) == {
        "cluster": {"worker": ["10.0.0.1:4000", "10.0.0.2:4001"]},
        "task": {"type": "worker", "index": 1},
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: HorovodRunner(np=2, options=LaunchOptions(engine="mpi")),
            "engine='mpi': expected one of horovod",
        ),
        (lambda: MirroredStrategyRunner(num_slots=0), "num_slots=0: expected a positive"),
    ],
)
def test_bad_engine_arguments_are_refused_with_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def one_averaged_gradient(fp16_compression: bool) -> float:
    import tensorflow as tf

    from hvdflow.training.engines import HOROVOD, start_engine

    engine = start_engine(HOROVOD, fp16_compression=fp16_compression)
    weight = tf.Variable([0.0])
    optimizer = engine.optimizer(tf.keras.optimizers.SGD(1.0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(weight * tf.constant([1.0 + 2.0**-12]))  # its gradient: 1 + 2^-12
    optimizer.minimize(loss, [weight], tape=tape)
    return float(-weight.numpy()[0])


@pytest.mark.integration
def test_horovods_fp16_compression_sends_the_gradients_as_float16():
    pytest.importorskip("horovod", reason="the horovod engine is not installed (current profile)")
    # 1 + 2^-12 has no float16: compressed on the wire, the averaged gradient comes back as 1.
    assert HorovodRunner(np=-2).run(one_averaged_gradient, fp16_compression=False) == 1 + 2**-12
    assert HorovodRunner(np=-2).run(one_averaged_gradient, fp16_compression=True) == 1.0
