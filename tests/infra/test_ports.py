"""Ports picked for a server to listen on a moment later: outside the range connections use."""

from __future__ import annotations

import socket

import pytest

from hvdflow.infra.ports import LOWEST, ephemeral_start, is_bindable, unclaimed_port

pytestmark = pytest.mark.unit


def test_a_picked_port_is_free_and_below_the_ephemeral_range():
    top = ephemeral_start()
    for _ in range(20):
        port = unclaimed_port("127.0.0.1")
        assert LOWEST <= port < top
        assert is_bindable(port, "127.0.0.1")


def test_a_port_in_use_is_not_bindable():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert not is_bindable(taken.getsockname()[1], "127.0.0.1")
