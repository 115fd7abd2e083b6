"""Ports, the readiness poller and where a start timeout comes from: no process started."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from infra.services import _process
from infra.services._process import free_port, port_is_free, wait_until_ready
from infra.services._service import Service, setting_name
from infra.services.mlflow_server import MlflowServer
from infra.services.prefect_server import PrefectServer
from infra.services.seaweed import SeaweedServer

pytestmark = pytest.mark.unit


class Probe(Service):
    name = "Probe"

    def _command(self) -> list[str]:
        raise AssertionError("no process is started in these tests")

    def _env(self) -> dict[str, str]:
        return {}

    def _ready(self) -> bool:
        return True


class SlowProbe(Probe):
    START_TIMEOUT_S = 7.5


class SlowerProbe(SlowProbe):
    pass


def test_a_free_port_avoids_the_given_ports_and_can_keep_its_neighbour_free(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        # The OS offers these in turn: the first is to be avoided, the second's neighbour is
        # busy, the third is fine.
        offered = iter([busy - 1, busy - 100, busy - 2])

        class Socket(socket.socket):
            def getsockname(self):
                return ("127.0.0.1", next(offered))

        monkeypatch.setattr(_process.socket, "socket", Socket)
        assert free_port({busy - 1}, neighbour_offset=100) == busy - 2
    assert port_is_free(busy)


def test_a_free_port_can_be_bound():
    port = free_port()
    assert port_is_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_poller_returns_once_the_probe_passes():
    answers = iter([ConnectionRefusedError("not yet"), False, True])

    def probe() -> bool:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    wait_until_ready(
        None, probe, what="x", timeout_s=5, setting="S", log_path=Path("l"), interval_s=0
    )


def test_the_poller_times_out_naming_the_setting_the_last_error_and_the_log():
    def probe() -> bool:
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    with pytest.raises(RuntimeError) as err:
        wait_until_ready(
            None,
            probe,
            what="MLflow server at http://127.0.0.1:5000",
            timeout_s=0.05,
            setting="infra.services.local.START_TIMEOUT_S",
            log_path=Path("/home/u/.hvdflow/mlflow/mlflow-server.log"),
            interval_s=0.01,
        )
    assert str(err.value) == (
        "MLflow server at http://127.0.0.1:5000 was not ready within 0.05 s "
        "(set by infra.services.local.START_TIMEOUT_S); last error: ConnectionRefusedError: "
        "[Errno 111] Connection refused; see /home/u/.hvdflow/mlflow/mlflow-server.log"
    )


def test_a_default_start_timeout_is_named_after_the_class_that_sets_it(tmp_path):
    assert Probe(tmp_path, port=1)._start_timeout(None, None) == (
        60.0,
        "infra.services._service.Service.START_TIMEOUT_S",
    )
    assert SlowerProbe(tmp_path, port=1)._start_timeout(None, None) == (
        7.5,
        f"{__name__}.SlowProbe.START_TIMEOUT_S",
    )
    assert SeaweedServer(tmp_path, port=1)._start_timeout(None, None) == (
        60.0,
        "infra.services.seaweed.SeaweedServer.START_TIMEOUT_S",
    )
    assert setting_name(MlflowServer, "STOP_TIMEOUT_S") == (
        "infra.services.mlflow_server.MlflowServer.STOP_TIMEOUT_S"
    )


def test_a_passed_start_timeout_is_named_by_its_setting_or_as_the_argument(tmp_path):
    probe = Probe(tmp_path, port=1)
    assert probe._start_timeout(2, "infra.services.local.START_TIMEOUT_S") == (
        2,
        "infra.services.local.START_TIMEOUT_S",
    )
    assert probe._start_timeout(2.5, None) == (2.5, "Probe.start(timeout_s=2.5)")


def test_start_rejects_a_setting_without_a_timeout_and_a_timeout_that_is_not_positive(tmp_path):
    probe = Probe(tmp_path, port=1)
    with pytest.raises(ValueError, match="pass both, or neither"):
        probe.start(setting="X")
    with pytest.raises(ValueError, match=r"timeout_s=0 must be > 0 seconds"):
        probe.start(0)
    assert probe.process is None


def test_the_prefect_server_command_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://elsewhere:4200/api")
    server = PrefectServer(tmp_path / "prefect", port=4321)
    assert server._command()[1:] == [
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        "4321",
    ]
    env = server._env()
    assert "PREFECT_API_URL" not in env
    assert {k: env[k] for k in env if k.startswith("PREFECT_")} == {
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_API_URL": "http://127.0.0.1:4321/api",
    }
    assert (server.url, server.api_url, server.log_path) == (
        "http://127.0.0.1:4321",
        "http://127.0.0.1:4321/api",
        tmp_path / "prefect" / "server.log",
    )


def test_the_mlflow_server_command_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://elsewhere:5000")
    server = MlflowServer(tmp_path, "s3://b/artifacts", {"AWS_ENDPOINT_URL": "http://s3"}, 5123)
    assert server._command()[1:] == [
        "server",
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--artifacts-destination",
        "s3://b/artifacts",
        "--host",
        "127.0.0.1",
        "--port",
        "5123",
        "--workers",
        "1",
    ]
    env = server._env()
    assert "MLFLOW_TRACKING_URI" not in env and env["AWS_ENDPOINT_URL"] == "http://s3"
    assert server.tracking_uri == server.url == "http://127.0.0.1:5123"


def test_seaweedfs_gets_no_aws_keys_and_ports_whose_grpc_neighbours_do_not_clash(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-elses-key")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://elsewhere:5000")
    server = SeaweedServer(tmp_path, port=8333)
    assert not [k for k in server._env() if k.startswith(("AWS_", "MLFLOW_"))]
    flags = dict(arg.split("=", 1) for arg in server._command()[2:] if "=" in arg)
    assert flags["-s3.port"] == "8333" and flags["-dir"] == str(tmp_path / "data")
    http = [int(flags[f"-{name}.port"]) for name in ("master", "volume", "filer")]
    every_port = {8333, int(flags["-s3.port.grpc"])} | set(http) | {p + 10000 for p in http}
    assert len(every_port) == 2 + 2 * len(http)
    assert server.endpoint_url == server.env()["AWS_ENDPOINT_URL"] == "http://127.0.0.1:8333"
