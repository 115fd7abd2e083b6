"""A rank forked from its task where hvdflow's daemon imported TensorFlow, else a new one."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import types

import cloudpickle
import psutil
import pytest

from hvdflow import HorovodOptions, HorovodRunner, LaunchOptions
from hvdflow.infra.launcher import _rank_fork
from tests.helpers import fresh_python_workers, wait_for_no_ranks

# Shipped by value: rank processes cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

DAEMON_ENV = {"PATH": "/usr/bin", "PYTHONPATH": "/spark/pyspark.zip:/project", "LANG": "C.UTF-8"}


@pytest.fixture
def preloaded(monkeypatch):
    """This process as if ``_daemon`` had imported a rank's modules with DAEMON_ENV, and no
    framework had started since (whatever other tests of this worker ran)."""
    monkeypatch.setattr(_rank_fork, "_runtime_started", lambda: None)
    monkeypatch.setattr(
        _rank_fork,
        "_preloaded",
        _rank_fork._Preloaded(
            dict(DAEMON_ENV), dict(DAEMON_ENV), {}, frozenset(), frozenset(), [], print, print
        ),
    )


@pytest.mark.unit
def test_a_process_the_daemon_did_not_start_never_forks_a_rank(monkeypatch):
    monkeypatch.setattr(_rank_fork, "_preloaded", None)
    assert "not started by hvdflow's pyspark daemon" in _rank_fork.fork_refusal(DAEMON_ENV)


@pytest.mark.unit
def test_variables_read_after_import_allow_a_fork(preloaded):
    rank = {
        **DAEMON_ENV,
        "HOROVOD_RANK": "1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "4242",
        "HVDFLOW_EVENT_FD": "7",
        "TF_CONFIG": "{}",
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "_MLFLOW_TELEMETRY_SESSION_ID": "a5e1",  # set by MLflow's import in a scoring worker
        "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
        "TMPDIR": "/tmp/hvdflow-rank1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": "/project",  # Spark's zip taken away (rank_python_path)
        # torchrun's environment, which the torch engine sets (torch is not preloaded)
        "MASTER_ADDR": "10.0.0.1",
        "GROUP_RANK": "1",
        "ROLE_NAME": "default",
        "TORCHELASTIC_RUN_ID": "hvdflow-1",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }
    assert _rank_fork.fork_refusal(rank) is None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"OMP_NUM_THREADS": "1"}, "OMP_NUM_THREADS"),  # OpenBLAS read it when numpy loaded
        ({"CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES"),
        ({"LANG": "de_DE.UTF-8"}, "LANG"),
        ({"PYTHONPATH": "/project:/elsewhere"}, "PYTHONPATH adds entries"),
    ],
)
def test_a_variable_read_at_import_starts_a_new_interpreter_and_is_named(preloaded, changed, named):
    refusal = _rank_fork.fork_refusal({**DAEMON_ENV, "HOROVOD_RANK": "0", **changed})
    assert refusal is not None and named in refusal


@pytest.mark.unit
@pytest.mark.parametrize(
    ("module", "loaded", "named"),
    [
        (
            "tensorflow.python.eager.context",
            types.SimpleNamespace(_context=types.SimpleNamespace(_initialized=True)),
            "TensorFlow's runtime was started",
        ),
        ("torch", types.SimpleNamespace(), "PyTorch was loaded"),
    ],
)
def test_a_worker_that_ran_a_framework_before_starts_a_new_interpreter(
    monkeypatch, module, loaded, named
):
    # A reused Python worker that scored with TensorFlow (its context made, collective ops no
    # longer configurable) or ran torch (its OpenMP pool does not survive a fork).
    monkeypatch.setattr(_rank_fork, "_preloaded", None)
    idle = types.SimpleNamespace(_context=types.SimpleNamespace(_initialized=False))
    monkeypatch.setitem(sys.modules, "tensorflow.python.eager.context", idle)  # this process's
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setitem(sys.modules, module, loaded)
    assert named in _rank_fork._runtime_started()


@pytest.mark.unit
def test_tensorflow_imported_but_not_started_allows_a_fork(monkeypatch):
    idle = types.SimpleNamespace(_context=types.SimpleNamespace(_initialized=False))
    monkeypatch.setitem(sys.modules, "tensorflow.python.eager.context", idle)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert _rank_fork._runtime_started() is None


@pytest.mark.unit
def test_a_variable_the_rank_drops_is_a_change_too(preloaded):
    rank = {k: v for k, v in DAEMON_ENV.items() if k != "LANG"}
    assert "LANG" in _rank_fork.fork_refusal(rank)


def train_noting_how_the_rank_started():
    """What the rank found at its start, then the digits trained from fixed seeds."""
    import os
    import sys

    import numpy as np

    found = sorted(m for m in ("tensorflow", "horovod.tensorflow") if m in sys.modules)
    start = os.environ["HVDFLOW_RANK_START"]
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    draw = float(np.random.rand())  # numpy's global generator, as the process left it
    with open("/proc/self/comm") as f:
        name = f.read().strip()
    with open("/proc/self/cmdline", "rb") as f:
        command = f.read().split(b"\0")

    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvdflow.training.smoke import train_digits

    tf.keras.utils.set_random_seed(7)
    result = train_digits(epochs=1)
    result.update(
        found=found,
        starts=list(hvd.allgather_object(start)),
        names=list(hvd.allgather_object(name)),
        commands=list(hvd.allgather_object(b"hvdflow.infra.launcher._rank" in command)),
        sockets=list(hvd.allgather_object(sockets)),
        draws=list(hvd.allgather_object(draw)),
    )
    return result


@pytest.mark.slow
def test_a_rank_on_hvdflows_session_forks_with_tensorflow_loaded_and_trains_as_a_new_one(
    spark, tmp_path
):
    def run(**extra_env):
        options = LaunchOptions(
            spark=spark, log_dir=str(tmp_path), horovod=HorovodOptions(extra_env=extra_env)
        )
        return HorovodRunner(np=2, options=options).run(train_noting_how_the_rank_started)

    # Workers no earlier test ran TensorFlow in (a worker that did cannot fork: tested above).
    with fresh_python_workers(spark):
        forked = run()
        # A variable of the user's own may have been read at import: a new interpreter.
        new = run(MY_PROJECT_SETTING="1")

    assert forked["starts"] == ["forked", "forked"], forked["starts"]
    assert forked["found"] == ["horovod.tensorflow", "tensorflow"]
    assert (
        new["starts"]
        == ["new interpreter: the rank's environment differs in MY_PROJECT_SETTING, read at import"]
        * 2
    )
    assert new["found"] == []
    # The same model, bit for bit, on every rank of both.
    assert len(set(forked["checksums"] + new["checksums"])) == 1, (forked, new)
    # The fork holds none of its task's sockets to Spark and the driver: only the one the task
    # passes for BarrierTaskContext, as a new interpreter.
    assert forked["sockets"] == new["sockets"] == [1, 1]
    # What ps and top show: each rank by its name, and the rank's command line.
    assert forked["names"] == new["names"] == ["hvdflow-rank0", "hvdflow-rank1"]
    assert forked["commands"] == new["commands"] == [True, True]
    # numpy's generator, seeded once in the daemon, is seeded again in each fork.
    assert len(set(forked["draws"])) == 2
    assert wait_for_no_ranks() == []


@pytest.mark.integration
def test_a_daemon_whose_preload_fails_says_why_and_still_serves_spark(tmp_path):
    broken = tmp_path / "tensorflow"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "print('noise on stdout')\nraise ImportError('no AVX here')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    daemon = subprocess.Popen(
        [sys.executable, "-m", "hvdflow.infra.launcher._daemon"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        # What Spark reads first from the daemon's stdout: its port, and nothing printed before.
        (port,) = struct.unpack("!i", daemon.stdout.read(4))
        assert 0 < port < 65536
        daemon.stdin.close()  # Spark's way of stopping it (pyspark's daemon then exits 1)
        daemon.wait(timeout=30)
    finally:
        daemon.kill()
    stderr = daemon.stderr.read().decode()
    assert "could not preload a rank's imports: ImportError('no AVX here')" in stderr, stderr
    assert "noise on stdout" in stderr and "ranks start as new interpreters" in stderr


# A task in miniature: marks itself preloaded, registers an exit handler and holds a temporary
# folder as a task does, then forks a rank that prints, reads its TMPDIR and returns a value.
FORKING_TASK = """
import atexit, json, os, sys, tempfile, cloudpickle
from hvdflow.infra.launcher import _rank_fork
_rank_fork.mark_preloaded()
marks = sys.argv[1]
atexit.register(lambda: open(marks, "a").write(f"task handler in {os.getpid()}\\n"))
held = tempfile.TemporaryDirectory()

def main():
    print("rank says hi", flush=True)
    return {"tmpdir": tempfile.gettempdir(), "pid": os.getpid()}

payload, result = os.path.join(held.name, "payload.pkl"), os.path.join(held.name, "result.pkl")
with open(payload, "wb") as f:
    cloudpickle.dump((main, {}), f)
env = {**os.environ, "HVDFLOW_PARENT_PID": str(os.getpid()), "HOROVOD_RANK": "0",
       "TMPDIR": os.path.join(held.name)}
rank = _rank_fork.start_rank([payload, result], env, os.getcwd(), ())
out = rank.stdout.read().decode()
code = rank.wait(timeout=60)
with open(result, "rb") as f:
    returned = cloudpickle.load(f)
print(json.dumps({"forked": type(rank).__name__, "code": code, "out": out,
                  "returned": returned, "held": held.name, "kept": os.path.isdir(held.name),
                  "task_pid": os.getpid()}))
"""


@pytest.mark.integration
def test_a_forked_rank_runs_none_of_its_tasks_exit_handlers_and_honours_its_own_variables(
    tmp_path,
):
    marks = tmp_path / "marks"
    done = subprocess.run(
        [sys.executable, "-c", FORKING_TASK, str(marks)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["forked"] == "ForkedRank" and report["code"] == 0
    assert report["out"] == "rank says hi\n"
    # The task's folder outlived the rank's exit (its clean-up is the task's, at the task's end).
    assert report["kept"] is True
    assert report["returned"]["tmpdir"] == report["held"]  # TMPDIR read anew in the fork
    # The task's exit handler ran once, in the task: never in the rank.
    assert marks.read_text().splitlines() == [f"task handler in {report['task_pid']}"]
    assert report["returned"]["pid"] != report["task_pid"]


# A driver of its own (a fresh process: its first np<0 run is its first): four np=-2 runs of
# train_digits from one seed, each rank saying how it started and who its parent is; then a
# fifth whose ranks wait, each having written a file, for the test to SIGKILL the driver.
DRIVER = """
import json, os, sys, time
from hvdflow import HorovodRunner
from hvdflow.training.smoke import train_digits

def noting(epochs):
    import tensorflow as tf
    tf.keras.utils.set_random_seed(7)
    result = train_digits(epochs=epochs)
    return {**result, "start": os.environ.get("HVDFLOW_RANK_START"), "parent": os.getppid()}

def waiting(folder):
    import horovod.tensorflow.keras as hvd
    hvd.init()
    open(os.path.join(folder, str(hvd.rank())), "w").close()
    time.sleep(600)

for _ in range(4):
    print(json.dumps(HorovodRunner(np=-2).run(noting, epochs=1)), flush=True)
HorovodRunner(np=-2).run(waiting, folder=sys.argv[1])
"""


@pytest.mark.slow
def test_ranks_on_the_driver_fork_from_its_fork_server_from_its_second_run_and_die_with_it(
    tmp_path,
):
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        runs = [json.loads(driver.stdout.readline() or "null") for _ in range(4)]
        assert None not in runs, runs
        # The driver's own ranks first, then its fork server's: one process for every run.
        assert runs[0]["start"] == (
            "new interpreter: this process was not started by hvdflow's pyspark daemon"
        )
        assert runs[0]["parent"] == driver.pid
        assert [r["start"] for r in runs[1:]] == ["forked by the driver's fork server"] * 3
        (server,) = {r["parent"] for r in runs[1:]}
        assert psutil.Process(server).ppid() == driver.pid
        # The same model, bit for bit, however the ranks started.
        assert len({c for r in runs for c in r["checksums"]}) == 1, runs
        # The driver SIGKILLed mid-run: the server dies with it, and its ranks with the server.
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1"]
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        assert wait_for_no_ranks(10) == []
        assert not psutil.pid_exists(server) or psutil.Process(server).status() == "zombie"
    finally:
        if driver.poll() is None:
            driver.kill()
