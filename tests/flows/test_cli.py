"""The hvdflow command line as a user runs it."""

from __future__ import annotations

import pytest
import requests

from flows.cli import build_parser, main


@pytest.mark.parametrize("command", ["smoke", "up", "down", "run", "serve", "bench"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: hvdflow " + command in capsys.readouterr().out


@pytest.mark.slow
def test_up_prints_working_urls_and_down_stops_everything(tmp_path, monkeypatch, capsys):
    from infra.services import LocalServices

    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    for name in ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    try:
        assert main(["up", "--no-prefect"]) == 0
        out = capsys.readouterr().out
        services = LocalServices()
        urls = services.urls()
        assert set(urls) == {"s3", "mlflow"}
        assert urls["mlflow"] in out and urls["s3"] in out
        assert requests.get(urls["mlflow"] + "/health", timeout=5).status_code == 200
        secret = services.env()["AWS_SECRET_ACCESS_KEY"]
        assert secret not in out  # printed as where to find it, never the value
        pids = [info["pid"] for info in services.state().values()]
        assert main(["up", "--no-prefect"]) == 0  # idempotent: nothing new started
        assert [info["pid"] for info in LocalServices().state().values()] == pids
    finally:
        assert main(["down"]) == 0
    assert "stopped: mlflow, s3" in capsys.readouterr().out
    assert LocalServices().state() == {}
    assert main(["down"]) == 0
    assert "nothing was running" in capsys.readouterr().out
