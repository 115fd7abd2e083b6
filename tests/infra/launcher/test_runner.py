"""HorovodRunner on a real local[2] Spark session and on the driver (np < 0)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

import cloudpickle
import psutil
import pytest

from hvdflow import HorovodOptions, HorovodRunner, LaunchOptions, RankFailed
from hvdflow.infra.launcher import _driver
from hvdflow.infra.launcher._engines import NVIDIA_DEVICE, cores_for
from hvdflow.training.smoke import train_digits
from tests.helpers import rank_processes, wait_for_no_ranks

# The rank functions below live in this test module, which rank processes cannot import:
# ship them by value, as a notebook's functions are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SECRET = "feedfacefeedfacefeedfacefeedface"


# The stop paths below run ranks that import neither TensorFlow nor Horovod's framework layer:
# what is tested is the launcher stopping processes, and importing TensorFlow in every rank
# would cost each test seconds per rank for nothing.


def raise_on_rank_1():
    import os

    if os.environ["HOROVOD_RANK"] == "1":
        print("rank 1 about to fail", flush=True)
        raise ValueError("boom from rank 1")
    # Rank 0 waits as if in a collective that rank 1 never joins: only the launcher can end it.
    time.sleep(600)


def never_init():
    print("doing slow work before hvd.init()", flush=True)
    time.sleep(600)


def ready_then_wait():
    import os

    print(f"rank {os.environ['HOROVOD_RANK']} ready", flush=True)
    time.sleep(600)


def print_a_50_mb_line():
    import sys

    sys.stdout.write("x" * (50 * 1024 * 1024))  # one line, no newline yet
    sys.stdout.write("\nafter the huge line\n")
    sys.stdout.flush()


def print_many_lines_then_return():
    for i in range(20_000):
        print(f"line {i}")
    return "done"


def print_ready_then_wait():
    print("ready", flush=True)
    time.sleep(600)


def train_digits_saying_so_on_stderr(epochs):
    import os
    import sys

    print(f"rank {os.environ['HOROVOD_RANK']} starts training", file=sys.stderr, flush=True)
    return train_digits(epochs=epochs)


def assert_identical_weights(result, size):
    assert result["size"] == size
    assert len(result["checksums"]) == size
    assert len(set(result["checksums"])) == 1, result["checksums"]


@pytest.mark.slow
def test_np2_on_spark_trains_keras_with_identical_weights_on_both_ranks(
    spark, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(_driver.secrets, "token_hex", lambda n: SECRET)
    lines = []
    runner = HorovodRunner(
        np=2,
        driver_log_verbosity="all",
        options=LaunchOptions(spark=spark, log_dir=str(tmp_path), on_log_line=lines.append),
    )
    with caplog.at_level("INFO"):
        result = runner.run(train_digits_saying_so_on_stderr, epochs=2)

    assert_identical_weights(result, 2)
    assert 0.0 < result["loss"] < 2.5
    # Output streams live, tagged like mpirun's, from both ranks.
    tagged = [line.formatted() for line in lines]
    assert "[1,0]<stdout>:Epoch 1/2" in tagged
    assert "[1,1]<stderr>:rank 1 starts training" in tagged
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


@pytest.mark.integration
def test_log_callback_only_shows_only_log_to_driver_lines(caplog):
    def main():
        from hvdflow import log_to_driver

        print("plain output")
        log_to_driver("from the callback")

    with caplog.at_level("INFO", logger="hvdflow.infra.launcher.runner.ranks"):
        runner = HorovodRunner(np=-1)
        runner.run(main)
    shown = [
        r.getMessage() for r in caplog.records if r.name == "hvdflow.infra.launcher.runner.ranks"
    ]
    assert shown == ["[1,0]<log>:from the callback"]
    assert "[1,0]<stdout>:plain output" in open(runner.log_path).read()


@pytest.mark.integration
def test_rank_zero_return_value_comes_back_and_kwargs_arrive():
    def main(a, b):
        import os

        return {
            "sum": a + b,
            "rank": os.environ["HOROVOD_RANK"],
            "cycle": os.environ.get("HOROVOD_CYCLE_TIME"),
        }

    # A main that calls hvd.init() itself gets the launcher's cycle for a rank without a GPU.
    cycle = None if os.path.exists(NVIDIA_DEVICE) else "10"
    expected = {"sum": 5, "rank": "0", "cycle": cycle}
    assert HorovodRunner(np=-2).run(main, a=2, b=3) == expected


def report_cores(folder):
    import json
    import os
    import threading

    seen = {}
    # A thread started later (as TensorFlow's and Horovod's are) inherits the binding.
    later = threading.Thread(target=lambda: seen.update(thread=sorted(os.sched_getaffinity(0))))
    later.start()
    later.join()
    seen["main"] = sorted(os.sched_getaffinity(0))
    with open(os.path.join(folder, os.environ["HOROVOD_RANK"]), "w") as f:
        json.dump(seen, f)


@pytest.mark.integration
def test_cpu_ranks_of_a_host_each_run_on_cores_of_their_own_unless_told_not_to(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    bound = not os.path.exists(NVIDIA_DEVICE)  # ranks with a GPU are left alone
    for choice, folder in (("default", tmp_path / "a"), ("0", tmp_path / "b")):
        folder.mkdir()
        extra = {} if choice == "default" else {"HVDFLOW_BIND_TO_CORES": choice}
        HorovodRunner(np=-2, options=LaunchOptions(horovod=HorovodOptions(extra_env=extra))).run(
            report_cores, folder=str(folder)
        )
        seen = [json.loads((folder / str(rank)).read_text()) for rank in range(2)]
        if choice == "default" and bound:
            expected = [cores_for(rank, 2, allowed) or allowed for rank in range(2)]
        else:
            expected = [allowed, allowed]
        assert seen == [{"thread": cores, "main": cores} for cores in expected]


def use_the_barrier_task_context(rank_word):
    """What spark-tensorflow-distributor's own tests do in train_fn: the task's context."""
    import os

    from pyspark import BarrierTaskContext, TaskContext

    context = BarrierTaskContext.get()
    gathered = context.allGather(f"{rank_word}{os.environ['HOROVOD_RANK']}")
    context.barrier()
    return {
        "gathered": gathered,
        "again": context.allGather(str(context.partitionId())),
        "partition": context.partitionId(),
        "tasks": [info.address for info in context.getTaskInfos()],
        "same_as_task_context": TaskContext.get() is context,
        "cpus": context.cpus(),
        "attempt": context.attemptNumber(),
    }


@pytest.mark.integration
def test_a_function_gets_the_barrier_task_context_of_the_task_that_runs_it(spark):
    result = HorovodRunner(np=2, options=LaunchOptions(spark=spark)).run(
        use_the_barrier_task_context, rank_word="rank"
    )
    # Every task's message, in partition order, as Spark's allGather gives them; twice in a row.
    assert result["gathered"] == ["rank0", "rank1"]
    assert result["again"] == ["0", "1"]
    assert result["partition"] == 0 and result["attempt"] == 0
    assert len(result["tasks"]) == 2 and all(":" in address for address in result["tasks"])
    assert result["same_as_task_context"] and result["cpus"] == 1
    # On the driver there is no barrier task, as in the originals: pyspark's own error.
    with pytest.raises(RankFailed, match="NOT_IN_BARRIER_STAGE"):
        HorovodRunner(np=-1).run(use_the_barrier_task_context, rank_word="rank")


@pytest.mark.integration
def test_np_larger_than_the_cluster_fails_fast_naming_np_and_slots(spark):
    started = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        HorovodRunner(np=3, options=LaunchOptions(spark=spark, slot_wait_s=2)).run(train_digits)
    assert time.monotonic() - started < 30
    message = str(err.value)
    assert "np=3 needs 3 task slots but the cluster (local[2]) has 2" in message
    assert "lower np" in message and "slot_wait_s" in message


@pytest.mark.slow
def test_a_rank_that_raises_fails_the_run_with_its_rank_and_output(spark):
    started = time.monotonic()
    with pytest.raises(RankFailed) as err:
        HorovodRunner(np=2, options=LaunchOptions(spark=spark)).run(raise_on_rank_1)
    message = str(err.value)
    assert re.search(r"rank 1 on \S+( \(\S+\))? exited with code 1", message), message
    assert "[1,1]<stdout>:rank 1 about to fail" in message
    assert "[1,1]<stderr>:ValueError: boom from rank 1" in message
    assert time.monotonic() - started < 120
    assert wait_for_no_ranks() == []


@pytest.mark.slow
def test_a_rank_that_never_reaches_init_is_stopped_by_the_start_timeout(spark):
    with pytest.raises(RankFailed) as err:
        HorovodRunner(np=2, options=LaunchOptions(spark=spark, start_timeout_s=4)).run(never_init)
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
            HorovodRunner(np=2, options=LaunchOptions(spark=spark, on_log_line=watch)).run(
                ready_then_wait
            )
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
from hvdflow import HorovodRunner

def main():
    import os
    print(f"rank {os.environ['HOROVOD_RANK']} ready", flush=True)
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


@pytest.mark.unit
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
    "make, expected",
    [
        (lambda: HorovodRunner(np=0), "np=0: expected a non-zero integer"),
        (lambda: HorovodRunner(np="2"), "np='2': expected a non-zero integer"),
        (lambda: HorovodRunner(np=2, driver_log_verbosity="loud"), "driver_log_verbosity='loud'"),
        (lambda: HorovodRunner(np=2, options={"np": 2}), "options={'np': 2}: expected a Launch"),
        (lambda: LaunchOptions(start_timeout_s=0), "start_timeout_s=0: expected a positive"),
        (lambda: LaunchOptions(slot_wait_s="1"), "slot_wait_s='1': expected a positive"),
        (lambda: LaunchOptions(timeout_s=-1), "timeout_s=-1: expected a positive number or None"),
        (lambda: LaunchOptions(forward_env="AWS_PROFILE"), "forward_env='AWS_PROFILE': expected"),
        (
            lambda: LaunchOptions(heartbeat_timeout_s=1),
            "heartbeat_timeout_s=1: expected at least 6 seconds (3 heartbeats, one every 2 s)",
        ),
    ],
)
@pytest.mark.unit
def test_bad_arguments_are_rejected_with_the_value(make, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        make()


@pytest.mark.unit
def test_the_runner_reads_as_databricks_documents_it_and_takes_its_extras_as_options():
    assert list(inspect.signature(HorovodRunner).parameters) == [
        "np",
        "driver_log_verbosity",
        "options",
    ]
    with pytest.raises(TypeError, match="stall_timeout_s"):
        HorovodRunner(np=2, stall_timeout_s=60)
    options = LaunchOptions(forward_env=["AWS_PROFILE"])
    assert options.forward_env == ("AWS_PROFILE",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.timeout_s = 1  # type: ignore[misc]


@pytest.mark.integration
def test_rank_failed_and_log_line_are_public_and_a_failing_rank_raises_rank_failed():
    from hvdflow import LogLine
    from hvdflow.infra import RankFailed as PublicRankFailed
    from hvdflow.infra.launcher import LogLine as LauncherLogLine
    from hvdflow.infra.launcher import RankFailed as LauncherRankFailed

    assert PublicRankFailed is LauncherRankFailed and LogLine is LauncherLogLine
    assert issubclass(PublicRankFailed, RuntimeError)

    def main():
        print("about to fail", flush=True)
        raise ValueError("boom on the driver")

    lines = []
    with pytest.raises(PublicRankFailed) as err:
        HorovodRunner(np=-1, options=LaunchOptions(on_log_line=lines.append)).run(main)
    message = str(err.value)
    host = socket.gethostname()
    assert f"HorovodRunner np=-1: rank 0 on {host} (127.0.0.1) exited with code 1" in message
    assert "[1,0]<stdout>:about to fail" in message
    assert "[1,0]<stderr>:ValueError: boom on the driver" in message
    assert lines and all(isinstance(line, LogLine) for line in lines)
    assert wait_for_no_ranks() == []


@pytest.mark.integration
def test_a_rank_that_found_the_object_store_unreachable_is_a_transient_failure_named_first(
    monkeypatch,
):
    from hvdflow.infra.storage.object_store import ObjectStoreConfig

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "soak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-secret")
    # Nothing listens there: the store's own error, as a checkpoint upload meets it.
    config = ObjectStoreConfig(
        bucket="bkt", endpoint_url="http://127.0.0.1:9", attempts=1, connect_timeout_s=1
    )

    def main(config):
        from hvdflow.infra.storage.object_store import ObjectStore

        ObjectStore(config).put_bytes(b"x", "s3://bkt/checkpoint")

    with pytest.raises(RankFailed) as err:
        HorovodRunner(np=-1).run(main, config=config)
    first = str(err.value).splitlines()[0]
    # EX_TEMPFAIL: the training step runs another attempt, as for a killed rank.
    assert err.value.transient and "exited with code 75" in first, first
    assert "ObjectStoreUnreachableError: object store at http://127.0.0.1:9 is unreachable" in first


@pytest.mark.integration
def test_a_users_transient_error_asks_for_another_attempt_and_any_other_error_does_not():
    from hvdflow import TransientError

    def main(transient):
        try:
            raise ConnectionRefusedError("feature store at 10.0.0.7:6379")
        except ConnectionRefusedError as e:
            if transient:
                raise TransientError("the feature store did not answer") from e
            raise RuntimeError("the feature store did not answer") from e

    with pytest.raises(RankFailed) as err:
        HorovodRunner(np=-1).run(main, transient=True)
    assert err.value.transient and "exited with code 75" in str(err.value)
    assert "TransientError: the feature store did not answer" in str(err.value)
    with pytest.raises(RankFailed) as err:
        HorovodRunner(np=-1).run(main, transient=False)
    assert not err.value.transient and "exited with code 1" in str(err.value)


@pytest.mark.integration
def test_a_ranks_temporary_files_go_with_it(tmp_path):
    def main():
        import tempfile

        # What TensorFlow's AutoGraph does, and leaves behind when a rank is killed.
        with tempfile.NamedTemporaryFile(suffix=".py", delete=False) as f:
            f.write(b"x = 1\n")
        return f.name

    left = HorovodRunner(np=-1).run(main)
    assert "hvdflow-rank0-" in left and not os.path.exists(left)


@pytest.mark.integration
def test_a_50_mb_line_is_shipped_cut_with_a_marker_and_the_next_line_arrives(tmp_path):
    lines = []
    runner = HorovodRunner(
        np=-1, options=LaunchOptions(log_dir=str(tmp_path), on_log_line=lines.append)
    )
    peak_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert runner.run(print_a_50_mb_line) is None

    cut = "x" * (64 * 1024) + " [... line truncated: 52428800 bytes]"
    assert [line.text for line in lines if line.stream == "stdout"] == [cut, "after the huge line"]
    log_lines = (tmp_path / "driver.log").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in log_lines] == [
        f"[1,0]<stdout>:{cut}",
        "[1,0]<stdout>:after the huge line",
    ]
    # The driver (and, with np < 0, the task) never held the line: far below its 50 MB.
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before_kib) / 1024
    assert grown_mib < 20, f"peak memory grew by {grown_mib:.0f} MiB"


@pytest.mark.integration
def test_every_line_a_rank_printed_before_returning_reaches_the_log(tmp_path):
    # The rank's last lines are still on their way when its result is: the driver reads them
    # all before it closes the channel.
    lines = []
    runner = HorovodRunner(
        np=-1, options=LaunchOptions(log_dir=str(tmp_path), on_log_line=lines.append)
    )
    assert runner.run(print_many_lines_then_return) == "done"
    printed = [f"line {i}" for i in range(20_000)]
    assert [line.text for line in lines if line.stream == "stdout"] == printed
    log_lines = (tmp_path / "driver.log").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in log_lines] == [f"[1,0]<stdout>:{t}" for t in printed]


@pytest.mark.integration
def test_a_rank_that_never_reaches_init_names_start_timeout_s():
    started = time.monotonic()
    with pytest.raises(RankFailed) as err:
        # 4 s: on a loaded machine a rank's interpreter can take a second or two to print.
        HorovodRunner(np=-1, options=LaunchOptions(start_timeout_s=4)).run(never_init)
    assert (
        f"rank 0 on {socket.gethostname()} (127.0.0.1) did not reach hvd.init() within 4 s "
        "(HorovodRunner start_timeout_s)"
    ) in str(err.value)
    assert "[1,0]<stdout>:doing slow work before hvd.init()" in str(err.value)
    assert time.monotonic() - started < 30
    assert wait_for_no_ranks() == []


@pytest.mark.integration
def test_a_run_over_its_time_limit_names_timeout_s_and_stops_its_ranks():
    with pytest.raises(TimeoutError) as err:
        HorovodRunner(np=-1, options=LaunchOptions(timeout_s=2)).run(print_ready_then_wait)
    assert str(err.value) == (
        "HorovodRunner np=-1 did not finish within 2 s (LaunchOptions.timeout_s): raise "
        "timeout_s or shorten the run"
    )
    assert wait_for_no_ranks() == []


def children_ranks(pid: int) -> list[psutil.Process]:
    found = []
    for proc in rank_processes():
        try:
            if proc.ppid() == pid:
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def is_alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


KILLED_DRIVER_SCRIPT = """
import sys, time
from hvdflow import HorovodRunner

def main():
    print("ready", flush=True)
    time.sleep(600)

HorovodRunner(np=-1, driver_log_verbosity="all").run(main)
"""


@pytest.mark.integration
def test_a_sigkilled_driver_leaves_no_rank_behind(tmp_path):
    # With np < 0 the driver is the rank's parent, as the Spark worker is for np > 0: SIGKILL
    # leaves it no chance to clean up, so only the rank's PR_SET_PDEATHSIG can stop the rank.
    script = tmp_path / "driver.py"
    script.write_text(KILLED_DRIVER_SCRIPT)
    driver = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (ours := children_ranks(driver.pid)):
            assert driver.poll() is None and time.monotonic() < deadline, "no rank started"
            time.sleep(0.1)
        driver.kill()
        driver.wait(10)
        killed_at = time.monotonic()
        while alive := [p for p in ours if is_alive(p)]:
            assert time.monotonic() - killed_at < 5, f"ranks outlived their parent: {alive}"
            time.sleep(0.1)
    finally:
        if driver.poll() is None:
            driver.kill()
