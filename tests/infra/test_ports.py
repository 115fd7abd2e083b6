"""Ports picked for a server to listen on a moment later: outside the range connections use."""

from __future__ import annotations

import socket

import pytest

from hvdflow.infra.ports import LOWEST, ephemeral_start, hold_port, is_bindable, unclaimed_port

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


def test_a_held_port_is_taken_for_other_picks_and_free_for_the_server_it_is_held_for():
    with hold_port("127.0.0.1") as held:
        port = held.getsockname()[1]
        assert LOWEST <= port < ephemeral_start()
        assert not is_bindable(port, "127.0.0.1")  # every other pick passes it by
        # A pick for a server on another address passes it by too: listening there, that
        # server would keep torch's TCPStore off the port, since the store listens on every
        # address (seen in CI: "EADDRINUSE" from rank 0, a service of another test on the
        # cluster's address meanwhile).
        assert not is_bindable(port, "127.0.0.2")
        with socket.socket() as server:  # as torch's TCPStore binds: every address
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("", port))
            server.listen()
    assert is_bindable(port, "127.0.0.1")  # given back when the holder closes it
