"""`hvdflow up --bind`: every service on that address, each requiring credentials, none shown."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading

import boto3
import pytest
import requests
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from hvdflow.infra.services.local import LocalServices
from tests.infra.services.helpers import non_loopback_address

SERVICE_URLS = ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")
SECRETS = ("AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD", "PREFECT_API_AUTH_STRING")


def _state(host: str, auth: bool) -> dict:
    """A state file's content for three services on ``host`` (pids are not looked at here)."""
    return {
        "s3": {"pid": 1, "url": f"http://{host}:8333", "host": host, "port": 8333, "auth": True},
        "mlflow": {
            "pid": 1,
            "url": f"http://{host}:5000",
            "host": host,
            "port": 5000,
            "auth": auth,
        },
        "prefect": {
            "pid": 1,
            "url": f"http://{host}:4200/api",
            "host": host,
            "port": 4200,
            "auth": auth,
        },
    }


@pytest.mark.unit
def test_env_carries_every_credential_the_running_services_require(tmp_path):
    services = LocalServices(tmp_path)
    env = services.env(_state("10.0.0.5", auth=True))
    credentials = {
        name: json.loads((tmp_path / name / "credentials.json").read_text())
        for name in ("seaweed", "mlflow", "prefect")
    }
    assert env == {
        "AWS_ENDPOINT_URL": "http://10.0.0.5:8333",
        "AWS_ACCESS_KEY_ID": credentials["seaweed"]["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": credentials["seaweed"]["secret_access_key"],
        "AWS_DEFAULT_REGION": "us-east-1",
        "MLFLOW_S3_ENDPOINT_URL": "http://10.0.0.5:8333",
        "MLFLOW_TRACKING_URI": "http://10.0.0.5:5000",
        "MLFLOW_TRACKING_USERNAME": "admin",
        "MLFLOW_TRACKING_PASSWORD": credentials["mlflow"]["password"],
        "PREFECT_API_URL": "http://10.0.0.5:4200/api",
        "PREFECT_API_AUTH_STRING": credentials["prefect"]["auth_string"],
    }
    assert services.secret_sources(_state("10.0.0.5", auth=True)) == {
        "AWS_SECRET_ACCESS_KEY": f'"secret_access_key" in {tmp_path / "seaweed/credentials.json"}',
        "MLFLOW_TRACKING_PASSWORD": f'"password" in {tmp_path / "mlflow/credentials.json"}',
        "PREFECT_API_AUTH_STRING": f'"auth_string" in {tmp_path / "prefect/credentials.json"}',
    }
    for name in ("seaweed", "mlflow", "prefect"):
        assert (tmp_path / name / "credentials.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.unit
def test_on_loopback_only_the_object_store_needs_keys(tmp_path):
    env = LocalServices(tmp_path).env(_state("127.0.0.1", auth=False))
    assert set(env) == {
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
        "MLFLOW_S3_ENDPOINT_URL",
        "MLFLOW_TRACKING_URI",
        "PREFECT_API_URL",
    }
    assert not (tmp_path / "mlflow").exists() and not (tmp_path / "prefect").exists()


@pytest.mark.unit
def test_running_services_keep_their_address_and_another_one_is_refused(tmp_path):
    services = LocalServices(tmp_path)
    state = _state("127.0.0.1", auth=False)
    assert services._bind_address(state, None) == "127.0.0.1"
    assert services._bind_address(state, "127.0.0.1") == "127.0.0.1"
    assert services._bind_address({}, None) == "127.0.0.1"
    with pytest.raises(RuntimeError) as err:
        services._bind_address(state, "127.0.0.2")
    assert str(err.value) == (
        f"the services of {tmp_path} already run on 127.0.0.1 (mlflow, prefect, s3): stop them "
        "with `hvdflow down` before binding them to 127.0.0.2"
    )
    with pytest.raises(ValueError, match="listens on every interface"):
        services._bind_address({}, "0.0.0.0")


@pytest.mark.unit
def test_a_service_that_died_comes_back_on_its_address_and_port_when_they_are_free(
    tmp_path, monkeypatch
):
    from hvdflow.infra.services import local

    monkeypatch.setattr(local, "PREVIOUS_PORT_WAIT_S", 1.0)
    services = LocalServices(tmp_path)
    dead = _state("127.0.0.2", auth=True)
    # Nothing runs: `up` without --bind starts them where their clients still call.
    assert services._bind_address({}, None, recorded=dead) == "127.0.0.2"
    # An explicit address wins over the dead ones' (nothing runs there to conflict).
    assert services._bind_address({}, "127.0.0.1", recorded=dead) == "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        before = {"host": "127.0.0.2", "port": s.getsockname()[1]}
        # Taken (a client's socket, another program): the conventional port, else any.
        assert local._port("mlflow", "127.0.0.2", before) != before["port"]
    assert local._port("mlflow", "127.0.0.2", before) == before["port"]
    # A port it had on another address says nothing of this one.
    assert local._port("mlflow", "127.0.0.3", before) != before["port"]
    # Held a moment longer by the killed server's exiting processes: it waits for it.
    holder = socket.socket()
    holder.bind(("127.0.0.2", before["port"]))
    threading.Timer(0.3, holder.close).start()
    assert local._port("mlflow", "127.0.0.2", before) == before["port"]


@pytest.mark.unit
def test_another_homes_server_on_loopback_does_not_move_one_bound_elsewhere(monkeypatch):
    """The soak's Prefect server on the cluster address, killed and started again while a test
    on the other xdist worker had its own on 127.0.0.1:4200, came back on another port, and its
    flow run, holding the old URL, waited until the test's timeout. Only SeaweedFS, whose S3
    gateway listens on loopback as well, needs the port free there too."""
    from hvdflow.infra.services import local

    monkeypatch.setattr(local, "PREVIOUS_PORT_WAIT_S", 0.5)
    with socket.socket() as other_home:
        other_home.bind(("127.0.0.1", 0))
        other_home.listen()
        port = other_home.getsockname()[1]
        before = {"host": "127.0.0.2", "port": port}
        assert local._port("prefect", "127.0.0.2", before) == port
        assert local._port("mlflow", "127.0.0.2", before) == port
        assert local._port("s3", "127.0.0.2", before) != port
        assert local._port("prefect", "127.0.0.1", {"host": "127.0.0.1", "port": port}) != port


@pytest.mark.unit
def test_a_home_with_ports_of_its_own_prefers_them_to_the_conventional_ones(tmp_path):
    """A home given ports of its own takes them when free (and any free one when not), so it
    leaves 8333, 5000 and 4200 to the other homes on the machine."""
    from hvdflow.infra.services import local

    own, before = local.free_port(), local.free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        services = local.LocalServices(tmp_path, ports={"s3": own, "prefect": busy})
        assert services._port_for("s3", "127.0.0.1", {}) == own
        assert services._port_for("prefect", "127.0.0.1", {}) not in (busy, 4200)
        # A port it had before still comes first: a restarted service keeps its URL.
        recorded = {"s3": {"host": "127.0.0.1", "port": before}}
        assert services._port_for("s3", "127.0.0.1", recorded) == before


@pytest.mark.unit
def test_a_bad_bind_address_is_a_bad_parameter_and_starts_nothing(tmp_path, monkeypatch, capfd):
    from hvdflow.flows.cli import main

    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    assert main(["up", "--bind", "0.0.0.0"]) == 2
    assert capfd.readouterr().err.strip().splitlines() == [
        "hvdflow up: --bind: bind address '0.0.0.0' listens on every interface but names none "
        "that other hosts can connect to: pass the address of this machine that they reach "
        "(e.g. 10.0.0.5), or 127.0.0.1 for this machine only"
    ]
    assert not (tmp_path / "home" / "services.json").exists()


def _basic(auth_string: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(auth_string.encode()).decode()}


@pytest.mark.slow
def test_up_beyond_loopback_requires_credentials_everywhere_and_shows_no_secret(
    tmp_path, monkeypatch, capsys
):
    from hvdflow.flows.cli import main

    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no address beyond loopback to bind")
    home = tmp_path / "home"
    monkeypatch.setenv("HVDFLOW_HOME", str(home))
    for name in (*SERVICE_URLS, "AWS_ENDPOINT_URL_S3", "MLFLOW_TRACKING_USERNAME", *SECRETS):
        monkeypatch.delenv(name, raising=False)
    services = LocalServices(home)
    try:
        assert main(["up", "--bind", address]) == 0
        out = capsys.readouterr().out
        env = services.env()

        # Every service is at the bind address, and hands out the credentials it requires.
        for name in SERVICE_URLS:
            assert env[name].startswith(f"http://{address}:"), name
        assert all(url.startswith(f"http://{address}:") for url in services.urls().values())
        assert env["MLFLOW_TRACKING_USERNAME"] == "admin"
        secrets = [env[name] for name in SECRETS] + [env["PREFECT_API_AUTH_STRING"].split(":")[1]]

        # No secret is printed, logged or kept in the state file; they are in 0600 files.
        state_text = (home / "services.json").read_text()
        logs = [p for p in home.rglob("*.log")]
        assert len(logs) >= 4  # hvdflow up's own, and each server's
        for text in [out, state_text, *(p.read_text(errors="replace") for p in logs)]:
            assert not [secret for secret in secrets if secret in text]
        mlflow_credentials = home / "mlflow" / "credentials.json"
        assert f'export MLFLOW_TRACKING_PASSWORD=<"password" in {mlflow_credentials}>' in out
        private = [
            "services.json",
            "seaweed/credentials.json",
            "seaweed/s3-identities.json",
            "seaweed/grpc-tls/grpc.key",
            "mlflow/credentials.json",
            "mlflow/basic_auth.ini",
            "prefect/credentials.json",
        ]
        modes = {name: (home / name).stat().st_mode & 0o777 for name in private}
        assert modes == dict.fromkeys(private, 0o600)

        # Object store: no key, refused; the handed-out keys, accepted.
        unsigned = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}),
        )
        with pytest.raises(ClientError) as err:
            unsigned.list_buckets()
        assert err.value.response["Error"]["Code"] == "AccessDenied"
        signed = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        assert "hvdflow" in [b["Name"] for b in signed.list_buckets()["Buckets"]]

        # MLflow: no login or a wrong one, 401; the handed-out one, 200.
        search = f"{env['MLFLOW_TRACKING_URI']}/api/2.0/mlflow/experiments/search?max_results=1"
        admin = (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])
        assert requests.get(search, timeout=10).status_code == 401
        assert requests.get(search, auth=("admin", "wrong"), timeout=10).status_code == 401
        assert requests.get(search, auth=admin, timeout=10).status_code == 200

        # Prefect: no auth string or a wrong one, 401; the handed-out one, 200.
        flows = f"{env['PREFECT_API_URL']}/flows/filter"
        assert requests.post(flows, json={}, timeout=10).status_code == 401
        wrong = _basic("admin:wrong")
        assert requests.post(flows, json={}, headers=wrong, timeout=10).status_code == 401
        right = _basic(env["PREFECT_API_AUTH_STRING"])
        assert requests.post(flows, json={}, headers=right, timeout=10).status_code == 200

        # MLflow and Prefect listen on the bind address alone.
        for name in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
            port = int(env[name].split(":")[2].split("/")[0])
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0, name

        # A second `up` keeps them where they are; another address is refused.
        pids = {name: info["pid"] for name, info in services.state().items()}
        assert main(["up"]) == 0
        assert {name: info["pid"] for name, info in services.state().items()} == pids
        assert main(["up", "--bind", "127.0.0.1"]) == 1
    finally:
        assert main(["down"]) == 0
    assert "stopped: prefect, mlflow, s3" in capsys.readouterr().out
    assert services.state() == {}
    assert os.environ.get("MLFLOW_TRACKING_PASSWORD") is None  # `up` left this process alone
