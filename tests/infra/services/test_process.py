"""Ports, the readiness poller and where a start timeout comes from: no process started."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from hvdflow.infra.services import _process
from hvdflow.infra.services._process import (
    check_bind_address,
    free_port,
    is_loopback,
    port_is_free,
    url_host,
    wait_until_ready,
)
from hvdflow.infra.services._secrets import write_private
from hvdflow.infra.services._service import Service, setting_name
from hvdflow.infra.services.mlflow_server import MlflowServer
from hvdflow.infra.services.prefect_server import PrefectServer
from hvdflow.infra.services.seaweed import SeaweedServer

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


def test_a_free_port_avoids_the_given_ports_and_on_another_address_loopbacks_busy_ones(
    monkeypatch,
):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        # The picker offers these in turn: the first is to be avoided, the second is busy on
        # loopback (where SeaweedFS's S3 gateway listens too), the third is fine.
        offered = iter([busy - 1, busy, busy - 2])
        monkeypatch.setattr(_process, "unclaimed_port", lambda host: next(offered))
        assert free_port({busy - 1}, host="127.0.0.2") == busy - 2
    assert port_is_free(busy)


def test_a_port_whose_server_just_died_is_free_and_one_listened_on_is_not():
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not port_is_free(port)
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
            client.recv(1)
    assert port_is_free(port)


def test_a_free_port_can_be_bound():
    port = free_port()
    assert port_is_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_poller_returns_once_the_probe_passes_and_not_before():
    answers = [ConnectionRefusedError("not yet"), False, True, True]
    asked = []

    def probe() -> bool:
        answer = answers[len(asked)]
        asked.append(answer)
        if isinstance(answer, Exception):
            raise answer
        return answer

    wait_until_ready(
        None, probe, what="x", timeout_s=5, setting="S", log_path=Path("l"), interval_s=0
    )
    # It kept polling through the error and the False, and stopped at the first True.
    assert len(asked) == 3 and asked[-1] is True


def test_the_poller_times_out_naming_the_setting_the_last_error_and_the_log():
    def probe() -> bool:
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    with pytest.raises(RuntimeError) as err:
        wait_until_ready(
            None,
            probe,
            what="MLflow server at http://127.0.0.1:5000",
            timeout_s=0.05,
            setting="hvdflow.infra.services.local.START_TIMEOUT_S",
            log_path=Path("/home/u/.hvdflow/mlflow/mlflow-server.log"),
            interval_s=0.01,
        )
    assert str(err.value) == (
        "MLflow server at http://127.0.0.1:5000 was not ready within 0.05 s "
        "(set by hvdflow.infra.services.local.START_TIMEOUT_S); last error: "
        "ConnectionRefusedError: [Errno 111] Connection refused; "
        "see /home/u/.hvdflow/mlflow/mlflow-server.log"
    )


def test_a_default_start_timeout_is_named_after_the_class_that_sets_it(tmp_path):
    assert Probe(tmp_path, port=1)._start_timeout(None, None) == (
        60.0,
        "hvdflow.infra.services._service.Service.START_TIMEOUT_S",
    )
    assert SlowerProbe(tmp_path, port=1)._start_timeout(None, None) == (
        7.5,
        f"{__name__}.SlowProbe.START_TIMEOUT_S",
    )
    assert SeaweedServer(tmp_path, port=1)._start_timeout(None, None) == (
        60.0,
        "hvdflow.infra.services.seaweed.SeaweedServer.START_TIMEOUT_S",
    )
    assert setting_name(MlflowServer, "STOP_TIMEOUT_S") == (
        "hvdflow.infra.services.mlflow_server.MlflowServer.STOP_TIMEOUT_S"
    )


def test_a_passed_start_timeout_is_named_by_its_setting_or_as_the_argument(tmp_path):
    probe = Probe(tmp_path, port=1)
    assert probe._start_timeout(2, "hvdflow.infra.services.local.START_TIMEOUT_S") == (
        2,
        "hvdflow.infra.services.local.START_TIMEOUT_S",
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
    monkeypatch.setenv("PREFECT_SERVER_API_AUTH_STRING", "someone:elses")
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
        # Concurrency leases survive a restart (the soak found slots held for ever without).
        "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": (
            "prefect.server.concurrency.lease_storage.filesystem"
        ),
    }
    assert (server.url, server.api_url, server.log_path) == (
        "http://127.0.0.1:4321",
        "http://127.0.0.1:4321/api",
        tmp_path / "prefect" / "server.log",
    )
    assert server.env() == {"PREFECT_API_URL": "http://127.0.0.1:4321/api"}
    assert (server.auth, server.secret_sources()) == (False, {})
    assert not (tmp_path / "prefect" / "credentials.json").exists()


def test_the_prefect_server_with_auth_requires_a_generated_auth_string(tmp_path):
    server = PrefectServer(tmp_path / "prefect", port=4321, auth=True)
    auth_string = server.env()["PREFECT_API_AUTH_STRING"]
    user, password = auth_string.split(":")
    assert (user, len(password)) == ("admin", 43)
    assert server._env()["PREFECT_SERVER_API_AUTH_STRING"] == auth_string
    credentials = tmp_path / "prefect" / "credentials.json"
    assert credentials.stat().st_mode & 0o777 == 0o600
    assert server.secret_sources() == {"PREFECT_API_AUTH_STRING": f'"auth_string" in {credentials}'}
    # The same string at the next start: it was kept, not generated again.
    assert PrefectServer(tmp_path / "prefect", auth=True).env()["PREFECT_API_AUTH_STRING"] == (
        auth_string
    )


def test_the_mlflow_server_command_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://elsewhere:5000")
    monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", "someone-elses")
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
    assert "MLFLOW_AUTH_ADMIN_PASSWORD" not in env and "MLFLOW_AUTH_CONFIG_PATH" not in env
    assert server.tracking_uri == server.url == "http://127.0.0.1:5123"
    assert server.env() == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5123"}
    assert (server.auth, server.secret_sources()) == (False, {})


def test_the_mlflow_server_with_auth_runs_the_basic_auth_app_with_a_generated_admin(tmp_path):
    server = MlflowServer(tmp_path, "s3://b/artifacts", {}, 5123, auth=True)
    assert server._command()[-2:] == ["--app-name", "basic-auth"]
    server._prepare()
    env = server._env()
    password = server.env()["MLFLOW_TRACKING_PASSWORD"]
    assert server.env()["MLFLOW_TRACKING_USERNAME"] == "admin" and len(password) == 43
    assert env["MLFLOW_AUTH_CONFIG_PATH"] == str(tmp_path / "basic_auth.ini")
    assert len(env["MLFLOW_FLASK_SERVER_SECRET_KEY"]) == 43
    assert (tmp_path / "basic_auth.ini").read_text() == (
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{tmp_path / 'basic_auth.db'}\n"
        "admin_username = admin\n"
        f"admin_password = {password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "auth_cache_ttl_seconds = 60\n"
    )
    for name in ("basic_auth.ini", "credentials.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    assert server.secret_sources() == {
        "MLFLOW_TRACKING_PASSWORD": f'"password" in {tmp_path / "credentials.json"}'
    }


def test_beyond_loopback_mlflow_and_prefect_require_credentials_whatever_auth_says(tmp_path):
    address = "192.0.2.10"  # TEST-NET-1: a documentation address, not loopback
    mlflow_server = MlflowServer(tmp_path / "m", "s3://b/a", {}, 5123, host=address)
    prefect_server = PrefectServer(tmp_path / "p", 4321, host=address, auth=False)
    assert mlflow_server.auth and prefect_server.auth
    assert mlflow_server._command()[8:] == [
        "--port",
        "5123",
        "--workers",
        "1",
        "--allowed-hosts",
        "192.0.2.10,192.0.2.10:5123",
        "--cors-allowed-origins",
        "http://192.0.2.10:5123",
        "--app-name",
        "basic-auth",
    ]
    assert mlflow_server._command()[6:8] == ["--host", address]
    assert mlflow_server.env()["MLFLOW_TRACKING_URI"] == "http://192.0.2.10:5123"
    assert prefect_server._command()[3:5] == ["--host", address]
    assert prefect_server.env()["PREFECT_API_URL"] == "http://192.0.2.10:4321/api"
    assert prefect_server._env()["PREFECT_UI_API_URL"] == "http://192.0.2.10:4321/api"


def test_seaweedfs_gets_no_aws_keys_and_ports_whose_grpc_neighbours_do_not_clash(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-elses-key")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://elsewhere:5000")
    server = SeaweedServer(tmp_path, port=8333)
    assert not [k for k in server._env() if k.startswith(("AWS_", "MLFLOW_"))]
    command = server._command()
    assert command[1:4] == [
        f"-config_dir={tmp_path / 'grpc-tls'}",
        f"-logdir={tmp_path / 'logs'}",  # its log files in its home, not in /tmp
        "server",
    ]
    flags = dict(arg.split("=", 1) for arg in command[4:] if "=" in arg)
    assert flags["-s3.port"] == "8333" and flags["-dir"] == str(tmp_path / "data")
    http = [int(flags[f"-{name}.port"]) for name in ("master", "volume", "filer")]
    every_port = {8333, int(flags["-s3.port.grpc"])} | set(http) | {p + 10000 for p in http}
    assert len(every_port) == 2 + 2 * len(http)
    assert server.endpoint_url == server.env()["AWS_ENDPOINT_URL"] == "http://127.0.0.1:8333"


def test_seaweedfs_checks_the_generated_keys_and_puts_s3_alone_on_its_bind_address(tmp_path):
    server = SeaweedServer(tmp_path, port=8333, host="127.0.0.2")
    flags = dict(arg.split("=", 1) for arg in server._command()[4:] if "=" in arg)
    assert (flags["-ip"], flags["-ip.bind"], flags["-s3.ip.bind"]) == (
        "127.0.0.1",
        "127.0.0.1",
        "127.0.0.2",
    )
    assert flags["-s3.config"] == str(tmp_path / "s3-identities.json")
    server._prepare()
    credentials = json.loads((tmp_path / "credentials.json").read_text())
    assert json.loads((tmp_path / "s3-identities.json").read_text()) == {
        "identities": [
            {
                "name": "hvdflow",
                "credentials": [
                    {
                        "accessKey": credentials["access_key_id"],
                        "secretKey": credentials["secret_access_key"],
                    }
                ],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    assert server.env() == {
        "AWS_ENDPOINT_URL": "http://127.0.0.2:8333",
        "AWS_ACCESS_KEY_ID": credentials["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": credentials["secret_access_key"],
        "AWS_DEFAULT_REGION": "us-east-1",
        "MLFLOW_S3_ENDPOINT_URL": "http://127.0.0.2:8333",
    }
    security = (tmp_path / "grpc-tls" / "security.toml").read_text()
    assert security.startswith(f'[grpc]\nca = "{tmp_path / "grpc-tls" / "ca.crt"}"\n')
    assert security.count("client_cert = ") == 4  # master, volume, filer, s3
    private = ["credentials.json", "s3-identities.json", "grpc-tls/grpc.key"]
    assert {name: (tmp_path / name).stat().st_mode & 0o777 for name in private} == dict.fromkeys(
        private, 0o600
    )
    assert server.secret_sources() == {
        "AWS_SECRET_ACCESS_KEY": f'"secret_access_key" in {tmp_path / "credentials.json"}'
    }


def test_a_secret_file_is_private_even_when_an_older_one_was_not(tmp_path):
    path = tmp_path / "credentials.json"
    path.write_text("{}")
    path.chmod(0o644)
    write_private(path, '{"password": "p"}')
    assert (path.stat().st_mode & 0o777, path.read_text()) == (0o600, '{"password": "p"}')
    assert [p.name for p in tmp_path.iterdir()] == ["credentials.json"]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("10.0.0.5", False),
        ("192.0.2.10", False),
        ("fd00::2", False),
        ("no-such-host.invalid", False),  # cannot tell: treated as reachable from elsewhere
    ],
)
def test_what_counts_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_a_bind_address_must_be_one_of_this_machine_and_name_itself():
    assert check_bind_address("127.0.0.1") == "127.0.0.1"
    with pytest.raises(ValueError) as err:
        check_bind_address("0.0.0.0")
    assert str(err.value) == (
        "bind address '0.0.0.0' listens on every interface but names none that other hosts "
        "can connect to: pass the address of this machine that they reach (e.g. 10.0.0.5), "
        "or 127.0.0.1 for this machine only"
    )
    with pytest.raises(ValueError) as err:
        check_bind_address("192.0.2.10")
    assert str(err.value) == (
        "bind address '192.0.2.10' is not an address of this machine (Cannot assign requested "
        "address): pass one of its interfaces' addresses, or 127.0.0.1"
    )
    assert (url_host("10.0.0.5"), url_host("fd00::2")) == ("10.0.0.5", "[fd00::2]")


def test_a_connect_servers_executors_on_a_standalone_master_keep_temporary_files_at_home(
    tmp_path, monkeypatch
):
    from hvdflow.infra.services.spark_connect import SparkConnectServer

    monkeypatch.setenv("SPARK_HOME", str(tmp_path))  # no conf/spark-defaults.conf
    on_cluster = SparkConnectServer(tmp_path, 15002, master="spark://10.0.0.1:7077")
    conf = [a for a in on_cluster._command() if "executor.extraJavaOptions" in a]
    assert conf == ["spark.executor.extraJavaOptions=-Djava.io.tmpdir=."]
    given = {"spark.executor.extraJavaOptions": "-Xss4m"}
    mine = SparkConnectServer(tmp_path, 15002, master="spark://10.0.0.1:7077", conf=given)
    assert [a for a in mine._command() if "executor.extraJavaOptions" in a] == [
        "spark.executor.extraJavaOptions=-Xss4m -Djava.io.tmpdir=."
    ]
    local = SparkConnectServer(tmp_path, 15002)  # local[2]: the server's JVM is the executor
    assert not [a for a in local._command() if "executor.extraJavaOptions" in a]


def test_a_connect_servers_own_jvm_keeps_temporary_files_at_home(tmp_path, monkeypatch):
    """Its ML model cache (java.io.tmpdir/spark_connect_model_cache) outlives the server: the
    soak found it, and the lz4 libraries and artifacts of a killed server, in the machine's /tmp."""
    from hvdflow.infra.services.spark_connect import SparkConnectServer

    monkeypatch.setenv("SPARK_HOME", str(tmp_path))  # no conf/spark-defaults.conf
    server = SparkConnectServer(tmp_path / "home", 15002)
    assert f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={tmp_path}/home/tmp" in (
        server._command()
    )
    given = {"spark.driver.extraJavaOptions": "-Xss4m"}
    mine = SparkConnectServer(tmp_path / "home", 15002, conf=given)
    assert [a for a in mine._command() if "driver.extraJavaOptions" in a] == [
        f"spark.driver.extraJavaOptions=-Xss4m -Djava.io.tmpdir={tmp_path}/home/tmp"
    ]
    theirs = {"spark.driver.extraJavaOptions": "-Djava.io.tmpdir=/scratch"}
    elsewhere = SparkConnectServer(tmp_path / "home", 15002, conf=theirs)
    assert [a for a in elsewhere._command() if "driver.extraJavaOptions" in a] == [
        "spark.driver.extraJavaOptions=-Djava.io.tmpdir=/scratch"
    ]
    # The defaults the server's spark-submit reads: its SPARK_HOME's, not a client's conf dir
    # (its environment drops SPARK_CONF_DIR).
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Xss8m\n")
    client_conf = tmp_path / "client-conf"
    client_conf.mkdir()
    (client_conf / "spark-defaults.conf").write_text(
        "spark.driver.extraJavaOptions -Djava.io.tmpdir=/client\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(client_conf))
    assert [a for a in server._command() if "driver.extraJavaOptions" in a] == [
        f"spark.driver.extraJavaOptions=-Xss8m -Djava.io.tmpdir={tmp_path}/home/tmp"
    ]
