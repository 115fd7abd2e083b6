"""The wire contracts: line and message caps, against exact values, with no server."""

from __future__ import annotations

import io
import socket
import threading

import pytest

from hvdflow.infra.launcher import _driver, _wire

pytestmark = pytest.mark.unit

LIMIT = 8


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"short\n", [(b"short", 5)]),
        (b"12345678\n", [(b"12345678", 8)]),  # exactly the limit: whole
        (b"123456789\n", [(b"12345678", 9)]),  # one byte over: cut, full length counted
        (b"a" * 30 + b"\nnext\n", [(b"a" * 8, 30), (b"next", 4)]),
        (b"no newline at the end", [(b"no newli", 21)]),
        (b"tail", [(b"tail", 4)]),
        (b"\n\n", [(b"", 0), (b"", 0)]),
        (b"", []),
    ],
)
def test_read_line_cuts_at_the_limit_and_counts_the_whole_line(data, expected):
    stream = io.BytesIO(data)
    lines = []
    while (line := _wire.read_line(stream, LIMIT)) is not None:
        lines.append(line)
    assert lines == expected


def test_read_line_drops_the_rest_of_a_long_line_in_bounded_reads():
    reads = []

    class Recording(io.BytesIO):
        def readline(self, size=-1):
            reads.append(size)
            return super().readline(size)

    stream = Recording(b"x" * 1000 + b"\nafter\n")
    assert _wire.read_line(stream, LIMIT) == (b"x" * 8, 1000)
    assert _wire.read_line(stream, LIMIT) == (b"after", 5)
    assert reads and all(0 < size <= LIMIT + 1 for size in reads)


def test_line_text_marks_a_cut_line_with_its_full_length():
    assert _wire.line_text(b"whole", 5) == "whole"
    assert _wire.line_text(b"x" * 8, 1000) == "xxxxxxxx [... line truncated: 1000 bytes]"


def test_line_text_leaves_out_a_character_the_cut_split():
    euro = "€".encode()  # 3 bytes
    assert _wire.line_text(b"ab" + euro[:2], 40) == "ab [... line truncated: 40 bytes]"
    # Undecodable bytes in a whole line are replaced, not dropped.
    assert _wire.line_text(b"a\xffb", 3) == "a\ufffdb"


def test_capped_text_cuts_at_utf8_bytes():
    assert _wire.capped_text("short", limit=8) == "short"
    assert _wire.capped_text("€€€€", limit=8) == "€€ [... line truncated: 12 bytes]"


def test_read_message_refuses_a_message_over_the_limit_having_read_only_that_much():
    stream = io.BytesIO(b'{"type":"line","text":"' + b"y" * 100 + b'"}\n')
    with pytest.raises(_wire.MessageTooLarge):
        _wire.read_message(stream, limit=64)
    assert stream.tell() == 65


def test_read_message_accepts_a_message_of_exactly_the_limit():
    data = _wire.encode({"type": "hello", "token": "t"})
    assert _wire.read_message(io.BytesIO(data), limit=len(data)) == {
        "type": "hello",
        "token": "t",
    }


def test_a_message_over_the_cap_closes_the_connection():
    ours, theirs = socket.socketpair()
    conn = _wire.Connection(ours)
    big = b'{"type":"line","text":"' + b"z" * (3 * _wire.MAX_MESSAGE_BYTES) + b'"}\n'

    send_errors = []

    def send():  # bigger than the socket buffer: the reader must make room or close
        try:
            theirs.sendall(big + _wire.encode({"type": "line", "text": "after"}))
        except OSError as e:
            send_errors.append(e)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        assert conn.receive() is None
        assert ours.fileno() == -1  # closed, descriptor released
        sender.join(10)
        assert not sender.is_alive()
        # The sender sees the close: nothing after the oversized message was read.
        assert [type(e) for e in send_errors] in ([BrokenPipeError], [ConnectionResetError])
    finally:
        theirs.close()
        conn.close()


def test_messages_under_the_cap_arrive_in_order():
    ours, theirs = socket.socketpair()
    conn = _wire.Connection(ours)
    try:
        for text in ("one", "two"):
            theirs.sendall(_wire.encode({"type": _wire.LINE, "text": text}))
        theirs.shutdown(socket.SHUT_WR)
        assert conn.receive() == {"type": "line", "text": "one"}
        assert conn.receive() == {"type": "line", "text": "two"}
        assert conn.receive() is None
    finally:
        theirs.close()
        conn.close()


def test_the_largest_line_and_failure_report_a_task_sends_fit_the_message_cap():
    # Worst cases for JSON escaping: control characters (6 bytes each) in a line cut at
    # MAX_LINE_BYTES; characters outside the BMP (12 bytes each) in every tail line.
    worst_line = _wire.line_text(b"\x01" * _wire.MAX_LINE_BYTES, 50 * 1024 * 1024)
    line = _wire.LogLine(1.0, 123, _wire.STDERR, worst_line)
    assert len(_wire.encode({"type": _wire.LINE, **line.__dict__})) <= _wire.MAX_MESSAGE_BYTES
    tail = [_wire.tail_line("\U0001f600" * 100_000)] * _wire.TAIL_LINES
    report = {
        "type": _wire.FAILED,
        "rank": 123,
        # The longest host name a task reports, in the rank's name.
        "reason": f"rank 123 on {'h' * _wire.MAX_HOSTNAME_CHARS} (10.0.0.1) exited with code 1",
        "tail": tail,
        "exited_at": 1.0,
    }
    assert len(_wire.encode(report)) <= _wire.MAX_MESSAGE_BYTES


def test_the_largest_hello_and_a_heartbeat_fit_what_the_driver_reads_unauthenticated():
    hello = {
        "type": _wire.HELLO,
        "token": "f" * 32,
        "partition": 10**6,
        "hostname": "\U0001f600" * _wire.MAX_HOSTNAME_CHARS,  # 12 bytes each, escaped
    }
    assert len(_wire.encode(hello)) <= _driver.HELLO_MAX_BYTES
    assert _wire.encode({"type": _wire.HEARTBEAT}) == b'{"type":"heartbeat"}\n'


def test_a_log_line_splits_from_output_before_it_and_a_broken_one_stays_output():
    line = _wire.log_line("hello", 12.5).encode()
    assert _wire.split_log_line(line) == (b"", ("hello", 12.5))
    assert _wire.split_log_line(b"50%\r" + line) == (b"50%\r", ("hello", 12.5))
    assert _wire.split_log_line(line[:-3]) == (line[:-3], None)  # cut at the line limit
    assert _wire.split_log_line(b"plain") == (b"plain", None)
