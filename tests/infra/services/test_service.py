"""A service's start, timeout and stop with real processes (`sleep`, `sh`), no server."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from hvdflow.infra.services import local, stop_process_group
from hvdflow.infra.services._process import start_process
from hvdflow.infra.services._service import Service
from hvdflow.infra.services.local import LocalServices
from tests.infra.services.helpers import running_in_group

pytestmark = pytest.mark.integration


class Sleeper(Service):
    """Runs, but never answers."""

    name = "Sleeper"
    log_name = "sleeper.log"
    STOP_TIMEOUT_S = 2.0
    POLL_INTERVAL_S = 0.1
    command = ["sleep", "30"]

    def _command(self) -> list[str]:
        return list(self.command)

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    def _ready(self) -> bool:
        raise ConnectionRefusedError("nobody home")


class Exiter(Sleeper):
    name = "Exiter"
    command = ["sh", "-c", "echo cannot open the database; exit 3"]


class Stubborn(Sleeper):
    """Ignores SIGTERM, and so does the `sleep` it starts; ready once that `sleep` runs."""

    name = "Stubborn"
    STOP_TIMEOUT_S = 0.5
    command = ["sh", "-c", "trap '' TERM; sleep 30 & wait"]

    def _ready(self) -> bool:
        return bool(psutil.Process(self.pid).children())


def test_a_service_that_never_answers_fails_naming_the_timeout_and_its_log_and_is_stopped(
    tmp_path,
):
    server = Sleeper(tmp_path)
    with pytest.raises(RuntimeError) as err:
        server.start(timeout_s=1)
    assert str(err.value) == (
        f"Sleeper at http://127.0.0.1:{server.port} was not ready within 1 s "
        "(set by Sleeper.start(timeout_s=1)); last error: ConnectionRefusedError: nobody home; "
        f"see {tmp_path / 'sleeper.log'}"
    )
    assert server.process.returncode == -15  # SIGTERM
    assert running_in_group(server.pid) == []


def test_the_default_timeout_is_named_after_the_class_constant(tmp_path, monkeypatch):
    monkeypatch.setattr(Sleeper, "START_TIMEOUT_S", 0.3)
    with pytest.raises(RuntimeError) as err:
        Sleeper(tmp_path).start()
    assert str(err.value).split(" was not ready ")[1] == (
        f"within 0.3 s (set by {__name__}.Sleeper.START_TIMEOUT_S); "
        f"last error: ConnectionRefusedError: nobody home; see {tmp_path / 'sleeper.log'}"
    )


def test_a_service_that_exits_at_once_reports_its_exit_code(tmp_path):
    server = Exiter(tmp_path)
    with pytest.raises(RuntimeError) as err:
        server.start(timeout_s=30)
    assert str(err.value) == (
        f"Exiter at http://127.0.0.1:{server.port} exited with code 3 while starting; "
        f"see {tmp_path / 'sleeper.log'}"
    )
    assert "cannot open the database" in (tmp_path / "sleeper.log").read_text()


def test_what_ignores_sigterm_is_killed_with_its_whole_group(tmp_path, caplog):
    with Stubborn(tmp_path) as server:
        grandchild = psutil.Process(server.pid).children()[0]
        with pytest.raises(RuntimeError, match="Stubborn at .* is already running"):
            server.start()
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="hvdflow.infra.services._process"):
            server.stop()
    assert time.monotonic() - started >= Stubborn.STOP_TIMEOUT_S
    assert f"process group {server.pid} outlived SIGTERM by 0.5 s" in caplog.text
    assert server.process.returncode == -9  # SIGKILL
    assert not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE
    assert running_in_group(server.pid) == []
    server.stop()  # a second stop is harmless


class Unheeding(Stubborn):
    """A service that is known never to exit on SIGTERM (like `weed server`)."""

    KILL_EXPECTED = True


def test_a_sigkill_that_is_the_services_normal_stop_is_not_reported_as_news(tmp_path, caplog):
    with Unheeding(tmp_path) as server:
        with caplog.at_level(logging.DEBUG, logger="hvdflow.infra.services._process"):
            server.stop()
    assert server.process.returncode == -9  # still killed, with its group
    assert running_in_group(server.pid) == []
    [record] = [r for r in caplog.records if "outlived SIGTERM" in r.getMessage()]
    assert record.levelno == logging.DEBUG


def test_a_group_whose_leader_is_not_our_child_is_stopped_by_its_pid():
    # `hvdflow down` stops services that an earlier `hvdflow up` started: not its children.
    out = subprocess.run(
        ["sh", "-c", "setsid sleep 30 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout)
    deadline = time.monotonic() + 5
    while os.getpgid(pid) != pid:  # until setsid has made it a group of its own
        assert time.monotonic() < deadline
        time.sleep(0.01)
    stop_process_group(pid, timeout_s=2)
    assert running_in_group(pid) == []


def test_down_stops_the_groups_in_the_state_file_and_forgets_them(tmp_path):
    process = start_process(["sleep", "30"], tmp_path / "sleep.log")
    services = LocalServices(tmp_path)
    (tmp_path / "services.json").write_text(
        json.dumps({"prefect": {"pid": process.pid, "url": "http://127.0.0.1:1/api"}})
    )
    assert services.urls() == {
        "prefect": "http://127.0.0.1:1/api",
        "prefect_ui": "http://127.0.0.1:1",
    }
    assert services.down() == ["prefect"]
    assert running_in_group(process.pid) == []
    assert services.state() == {} and not (tmp_path / "services.json").exists()


def test_up_names_its_own_timeout_when_a_service_never_answers(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setattr(local, "START_TIMEOUT_S", 0.5)
    monkeypatch.setattr(local, "SeaweedServer", Sleeper)
    with pytest.raises(RuntimeError) as err:
        LocalServices(tmp_path).up(prefect=False)
    assert str(err.value).split(" was not ready ")[1] == (
        "within 0.5 s (set by hvdflow.infra.services.local.START_TIMEOUT_S); "
        "last error: ConnectionRefusedError: nobody home; "
        f"see {tmp_path / 'seaweed' / 'sleeper.log'}"
    )
    assert LocalServices(tmp_path).state() == {}


def test_a_service_started_where_sigint_is_ignored_gets_it_at_its_default(tmp_path):
    # A parent started as a background job (nohup, `&` in a script, a CI runner) ignores
    # SIGINT, and so would what it starts: Prefect's worker, which stops on SIGTERM by sending
    # itself SIGINT, then never stopped. Here a parent that ignores SIGINT starts a Python that
    # sleeps; SIGINT must end it.
    parent = (
        "import signal, sys, time\n"
        "from pathlib import Path\n"
        "from hvdflow.infra.services._process import start_process\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "child = start_process([sys.executable, '-c', 'import time; time.sleep(30)'],\n"
        "                      Path(sys.argv[1]))\n"
        "time.sleep(1)  # its Python is up, its handlers set\n"
        "child.send_signal(signal.SIGINT)\n"
        "try:\n"
        "    print(child.wait(10))\n"
        "except Exception:\n"
        "    child.kill()\n"
        "    print('still running')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", parent, str(tmp_path / "child.log")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # Python's default SIGINT handler: KeyboardInterrupt, then it ends itself with SIGINT.
    assert done.stdout.strip() == str(-signal.SIGINT), (done.stdout, done.stderr)
    assert "KeyboardInterrupt" in (tmp_path / "child.log").read_text()
