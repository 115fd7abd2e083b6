"""HorovodRunner on a real local[2] Spark session and on the driver (np < 0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import cloudpickle
import pytest

from infra import HorovodRunner, _driver_channel
from infra._driver_channel import DriverChannel
from infra._rank_supervisor import RankFailed
from tests.helpers import wait_for_no_ranks
from training.smoke import train_digits

# The rank functions below live in this test module, which rank processes cannot import:
# ship them by value, as a notebook's functions are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SECRET = "feedfacefeedfacefeedfacefeedface"


def raise_on_rank_1():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    if hvd.rank() == 1:
        print("rank 1 about to fail", flush=True)
        raise ValueError("boom from rank 1")
    # Rank 0 waits in a collective that rank 1 never joins: only the launcher can end it.
    hvd.allreduce(tf.constant(1.0))
    time.sleep(600)


def never_init():
    print("doing slow work before hvd.init()", flush=True)
    time.sleep(600)


def init_then_wait():
    import horovod.tensorflow as hvd

    hvd.init()
    print(f"rank {hvd.rank()} ready", flush=True)
    time.sleep(600)


def assert_identical_weights(result, size):
    assert result["size"] == size
    assert len(result["checksums"]) == size
    assert len(set(result["checksums"])) == 1, result["checksums"]


@pytest.mark.slow
def test_np2_on_spark_trains_keras_with_identical_weights_on_both_ranks(
    spark, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(_driver_channel.secrets, "token_hex", lambda n: SECRET)
    lines = []
    runner = HorovodRunner(
        np=2,
        spark=spark,
        driver_log_verbosity="all",
        log_dir=str(tmp_path),
        on_log_line=lines.append,
    )
    with caplog.at_level("INFO"):
        result = runner.run(train_digits, epochs=2)

    assert_identical_weights(result, 2)
    assert 0.0 < result["loss"] < 2.5
    # Output streams live, tagged like mpirun's, from both ranks.
    tagged = [line.formatted() for line in lines]
    assert "[1,0]<stdout>:Epoch 1/2" in tagged
    assert any(t.startswith("[1,1]<stderr>:") for t in tagged)
    assert "[1,0]<log>:Epoch 2/2" in tagged  # LogCallback through log_to_driver
    assert all(line.time > 0 for line in lines)
    log_text = (tmp_path / "driver.log").read_text()
    assert " [1,0]<stdout>:Epoch 1/2" in log_text
    # The channel's token is never written anywhere a user looks.
    assert SECRET not in log_text and SECRET not in caplog.text
    assert wait_for_no_ranks() == []


@pytest.mark.slow
def test_np_negative_runs_ranks_on_the_driver_with_identical_weights():
    result = HorovodRunner(np=-2).run(train_digits, epochs=1)
    assert_identical_weights(result, 2)
    assert wait_for_no_ranks() == []


def test_log_callback_only_shows_only_log_to_driver_lines(caplog):
    def main():
        from infra import log_to_driver

        print("plain output")
        log_to_driver("from the callback")

    with caplog.at_level("INFO", logger="infra.horovod_runner.ranks"):
        runner = HorovodRunner(np=-1)
        runner.run(main)
    shown = [r.getMessage() for r in caplog.records if r.name == "infra.horovod_runner.ranks"]
    assert shown == ["[1,0]<log>:from the callback"]
    assert "[1,0]<stdout>:plain output" in open(runner.log_path).read()


def test_rank_zero_return_value_comes_back_and_kwargs_arrive():
    def main(a, b):
        import os

        return {"sum": a + b, "rank": os.environ["HOROVOD_RANK"]}

    assert HorovodRunner(np=-2).run(main, a=2, b=3) == {"sum": 5, "rank": "0"}


def test_np_larger_than_the_cluster_fails_fast_naming_np_and_slots(spark):
    started = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        HorovodRunner(np=3, spark=spark, slot_wait_s=2).run(train_digits)
    assert time.monotonic() - started < 30
    message = str(err.value)
    assert "np=3 needs 3 task slots but the cluster (local[2]) has 2" in message
    assert "lower np" in message and "slot_wait_s" in message


@pytest.mark.slow
def test_a_rank_that_raises_fails_the_run_with_its_rank_and_output(spark):
    started = time.monotonic()
    with pytest.raises(RankFailed) as err:
        HorovodRunner(np=2, spark=spark).run(raise_on_rank_1)
    message = str(err.value)
    assert "rank 1 exited with code 1" in message
    assert "[1,1]<stdout>:rank 1 about to fail" in message
    assert "[1,1]<stderr>:ValueError: boom from rank 1" in message
    assert time.monotonic() - started < 120
    assert wait_for_no_ranks() == []


@pytest.mark.slow
def test_a_rank_that_never_reaches_init_is_stopped_by_the_start_timeout(spark):
    with pytest.raises(RankFailed) as err:
        HorovodRunner(np=2, spark=spark, start_timeout_s=4).run(never_init)
    message = str(err.value)
    assert "did not reach hvd.init() within 4 s (HorovodRunner start_timeout_s)" in message
    assert "doing slow work before hvd.init()" in message
    assert wait_for_no_ranks() == []


@pytest.mark.slow
def test_cancelling_the_spark_job_stops_every_rank(spark):
    ready = threading.Event()

    def watch(line):
        if "ready" in line.text:
            ready.set()

    errors = []

    def run():
        try:
            HorovodRunner(np=2, spark=spark, on_log_line=watch).run(init_then_wait)
        except Exception as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    assert ready.wait(120), "ranks never reported ready"
    spark.sparkContext.cancelAllJobs()
    cancelled_at = time.monotonic()
    thread.join(60)
    assert not thread.is_alive()
    assert errors and "cancelled" in str(errors[0])
    assert wait_for_no_ranks(10.0 - (time.monotonic() - cancelled_at)) == []


DRIVER_SCRIPT = """
import logging, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from infra import HorovodRunner

def main():
    import horovod.tensorflow as hvd
    hvd.init()
    print(f"rank {hvd.rank()} ready", flush=True)
    time.sleep(600)

HorovodRunner(np=int(sys.argv[1]), driver_log_verbosity="all").run(main)
"""


@pytest.mark.slow
@pytest.mark.parametrize("np", [2, -2])
def test_ctrl_c_on_the_driver_stops_every_rank_within_10_seconds(np, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER_SCRIPT)
    env = {**os.environ, "HVDFLOW_SPARK_MASTER": "local[2]", "SPARK_LOCAL_IP": "127.0.0.1"}
    driver = subprocess.Popen(
        [sys.executable, str(script), str(np)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    seen = []
    try:
        for line in driver.stdout:
            seen.append(line)
            if sum("ready" in s for s in seen) >= 2:
                break
        assert sum("ready" in s for s in seen) >= 2, "".join(seen[-30:])
        driver.send_signal(signal.SIGINT)
        interrupted_at = time.monotonic()
        driver.wait(30)
        assert wait_for_no_ranks(10.0 - (time.monotonic() - interrupted_at)) == []
    finally:
        if driver.poll() is None:
            driver.kill()


def test_unpicklable_main_fails_before_any_task_naming_the_culprit():
    lock = threading.Lock()

    def main():
        with lock:
            return 1

    with pytest.raises(ValueError) as err:
        HorovodRunner(np=-2).run(main)
    assert "variable 'lock' (lock) that main captures cannot be pickled" in str(err.value)
    with pytest.raises(ValueError, match="keyword argument 'handle' \\(lock\\)"):
        HorovodRunner(np=-2).run(train_digits, handle=lock)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"np": 0}, "np=0: expected a non-zero integer"),
        ({"np": "2"}, "np='2': expected a non-zero integer"),
        ({"np": 2, "driver_log_verbosity": "loud"}, "driver_log_verbosity='loud'"),
        ({"np": 2, "start_timeout_s": 0}, "start_timeout_s=0: expected a positive"),
    ],
)
def test_bad_arguments_are_rejected_with_the_value(kwargs, expected):
    with pytest.raises(ValueError, match=expected.replace("(", "\\(")):
        HorovodRunner(**kwargs)


def test_driver_servers_listen_only_on_the_executor_facing_address():
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        assert channel._server.server_address[0] == "127.0.0.1"
        assert channel._rendezvous.server_address[0] == "127.0.0.1"


def test_the_error_names_the_rank_that_failed_first_not_the_one_that_noticed():
    shutdown = "[1,0]<stderr>:... Horovod has been shut down. This was caused by an exception"
    with DriverChannel("127.0.0.1", on_line=lambda line: None) as channel:
        # Rank 0's report (a consequence) arrives before rank 1's (the cause).
        channel.failures.append(
            {"rank": 0, "reason": "rank 0 exited", "tail": [shutdown], "exited_at": 10.2}
        )
        channel.failures.append(
            {"rank": 1, "reason": "rank 1 exited", "tail": ["boom"], "exited_at": 10.0}
        )
        root, others = channel.root_failure()
    assert root["rank"] == 1 and others == [0]
