"""The tracking server check: fails fast naming the server, never its login."""

from __future__ import annotations

import socket

import pytest

from hvdflow.infra.tracking import check_reachable


@pytest.mark.unit
def test_an_unreachable_server_is_named_without_its_login():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RuntimeError) as err:
        check_reachable(f"http://ann:pw-8f3a@127.0.0.1:{port}")
    message = str(err.value)
    assert message.startswith(f"MLflow tracking server at http://127.0.0.1:{port} is unreachable")
    assert "pw-8f3a" not in message and "ann" not in message
