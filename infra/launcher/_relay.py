"""The task <-> driver channel through the object store, for executors that cannot reach the
driver (a Spark Connect client behind NAT, a container with no inbound port).

Both sides already reach the bucket, so the ``_wire`` messages travel as objects, unchanged,
through two mailboxes per rank slot under the run's key:

    <prefix>/relay/<run id>/up/<slot>/<seq>     task -> driver, batches of JSON lines
    <prefix>/relay/<run id>/down/<slot>/<seq>   driver -> task, one message each

A reader deletes what it has read; the driver removes what is left when the run ends.

Limits: a killed executor closes no socket here, so the driver notices it only after
``heartbeat_timeout_s``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hvdflow.infra.launcher import _wire
from hvdflow.infra.storage.access import S3Access

logger = logging.getLogger(__name__)

FLUSH_S = 0.5  # how long a task holds its messages before it writes them as one object
POLL_S = 0.5  # how often each side lists its mailbox
CLOSE = "relay_close"  # driver -> task: the channel is closed (the run was aborted or is over)
# How long the driver's close waits for the tasks to read its aborts before it removes the run.
CLOSE_WAIT_S = 5.0
# Sent at once: they begin or end something the other side waits for.
_URGENT = frozenset(
    {_wire.HELLO, _wire.PLAN, _wire.PLAN_OK, _wire.GATHER, _wire.GATHERED}
    | {_wire.FAILED, _wire.BYE, CLOSE}
)
_END = object()


@dataclass(frozen=True)
class RelaySpec:
    """Where a run's relay lives, as plain values for the closure (``access`` holds the
    driver's object store credentials, never logged)."""

    access: S3Access
    bucket: str
    key: str  # the run's key, "<prefix>/relay/<run id>"
    always: bool = False  # tasks use it without trying the direct channel first

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}/"

    def mailbox(self, direction: str, slot: int) -> str:
        return f"{self.key}/{direction}/{slot:05d}/"


def relay_spec(run_id: str, always: bool) -> RelaySpec:
    """The relay of run ``run_id`` in the object store this process's environment names."""
    from hvdflow.infra.storage.object_store import ObjectStoreConfig  # noqa: PLC0415

    config = ObjectStoreConfig.from_env()
    return RelaySpec(S3Access.from_env(config), config.bucket, config.key("relay", run_id), always)


def _client(spec: RelaySpec):
    # Short timeouts: a poll that hangs delays every message behind it.
    return spec.access.client(4, connect_timeout_s=5.0, read_timeout_s=20.0, attempts=3)


def _decode(data: bytes) -> list[dict]:
    messages = []
    for line in data.splitlines():
        if len(line) > _wire.MAX_MESSAGE_BYTES:
            logger.warning("dropped a relay message over %d bytes", _wire.MAX_MESSAGE_BYTES)
            continue
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            messages.append(message)
    return messages


class _Mailbox:
    """Reads one mailbox in order, deleting what it has read."""

    def __init__(self, client, bucket: str, prefix: str):
        self._client, self._bucket, self.prefix = client, bucket, prefix

    def keys(self) -> list[str]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self._bucket, Prefix=self.prefix
        )
        # Zero-padded: sorted is the order they were written in, per slot.
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def read(self, key: str) -> list[dict]:
        return _decode(self._client.get_object(Bucket=self._bucket, Key=key)["Body"].read())

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self._bucket, Key=key)


class _Writer:
    """Numbered objects in one mailbox, one per ``write``."""

    def __init__(self, client, bucket: str, prefix: str):
        self._client, self._bucket, self._prefix = client, bucket, prefix
        self._seq = 0
        self._lock = threading.Lock()

    def write(self, messages: list[dict]) -> None:
        """Raises the client's error; what was not written is the caller's to keep."""
        body = b"".join(_wire.encode(m) for m in messages)
        with self._lock:
            key = f"{self._prefix}{self._seq:010d}"
            self._client.put_object(Bucket=self._bucket, Key=key, Body=body)
            self._seq += 1


class TaskRelay:
    """A task's end of the relay, with ``_wire.Connection``'s send, receive and close."""

    def __init__(self, spec: RelaySpec, slot: int):
        client = _client(spec)
        self._up = _Writer(client, spec.bucket, spec.mailbox("up", slot))
        self._down = _Mailbox(client, spec.bucket, spec.mailbox("down", slot))
        self._outbox: list[dict] = []
        self._lock = threading.Lock()
        # Set at bye or at the driver's close: nothing is written after, as the driver cleans up.
        self._done = False
        self._inbox: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        threading.Thread(target=self._flush_every, daemon=True, name="hvdflow-relay-up").start()
        threading.Thread(target=self._poll, daemon=True, name="hvdflow-relay-down").start()

    def send(self, message: dict) -> None:
        """Queued for FLUSH_S, or written now if urgent; OSError if that write fails (the
        message stays queued)."""
        with self._lock:
            self._outbox.append(message)
        if message.get("type") in _URGENT:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            batch, self._outbox = self._outbox, []
            if not batch or self._done:
                return
            try:
                self._up.write(batch)
            except Exception as e:  # botocore's errors: kept for the next flush
                self._outbox[:0] = batch
                raise OSError(f"the relay could not write to the object store: {e}") from None
            self._done = any(m.get("type") == _wire.BYE for m in batch)

    def _flush_every(self) -> None:
        while not self._closed.wait(FLUSH_S):
            # Kept; the driver's silence is what DriverLink.lost() watches.
            with contextlib.suppress(OSError):
                self._flush()

    def _poll(self) -> None:
        while not self._closed.wait(POLL_S):
            try:
                for key in self._down.keys():
                    messages = self._down.read(key)
                    if any(m.get("type") == CLOSE for m in messages):
                        # Stop writing (the lock waits out a write in flight) before the delete
                        # tells the driver its close was read: a later batch would stay behind.
                        with self._lock:
                            self._done = True
                    self._down.delete(key)
                    for message in messages:
                        if message.get("type") == CLOSE:
                            self._inbox.put(_END)
                            return
                        self._inbox.put(message)
            except Exception:  # the store is away: the driver's silence tells the rest
                continue

    def receive(self, limit: int = _wire.MAX_MESSAGE_BYTES) -> dict | None:
        message = self._inbox.get()
        return None if message is _END else message

    def close(self) -> None:
        if self._closed.is_set():
            return
        with contextlib.suppress(OSError):
            self._flush()  # the bye, and any lines before it
        self._closed.set()
        self._inbox.put(_END)


class DriverPeer:
    """The driver's end of one task's relay, with ``_wire.Connection``'s interface."""

    def __init__(self, writer: _Writer, slot: int):
        self.slot = slot
        self._writer = writer
        self._inbox: queue.Queue = queue.Queue()
        self._ended = threading.Event()  # the task said bye, or the driver closed it
        self.told_to_close = False

    def feed(self, messages: list[dict]) -> None:
        for message in messages:
            self._inbox.put(message)
            if message.get("type") == _wire.BYE:
                self._inbox.put(_END)  # a task closes after its bye, as a socket would

    def send(self, message: dict) -> None:
        try:
            self._writer.write([message])
        except Exception as e:
            raise OSError(f"the relay could not write to the object store: {e}") from None

    def receive(self, limit: int = _wire.MAX_MESSAGE_BYTES) -> dict | None:
        message = self._inbox.get()
        if message is _END:
            self._ended.set()
            return None
        return message

    def close(self) -> None:
        """Tell the task the channel is closed (it kills its rank), unless it has ended."""
        if not self._ended.is_set():
            self._ended.set()
            # On failure the task hears nothing, and gives the driver up after its timeout.
            with contextlib.suppress(Exception):
                self._writer.write([{"type": CLOSE}])
                self.told_to_close = True
        self._inbox.put(_END)


class DriverRelay:
    """Reads every task's up mailbox; ``serve(peer)`` runs in a thread for each slot that
    writes."""

    def __init__(
        self, spec: RelaySpec, serve: Callable[[DriverPeer], None], slots: int | None = None
    ):
        """``slots``: how many rank slots will say hello; once all have, directly, the relay
        stops listing (a listing every POLL_S costs requests)."""
        self.spec = spec
        self._client = _client(spec)
        self._serve = serve
        self._peers: dict[int, DriverPeer] = {}
        self._slots = slots
        self._direct: set = set()
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._poll, daemon=True, name="hvdflow-relay")
        self._thread.start()

    @property
    def used(self) -> bool:
        return bool(self._peers)

    def joined_directly(self, slot) -> None:
        """Slot ``slot`` said hello over the direct channel."""
        self._direct.add(slot)
        if self._slots is not None and len(self._direct) >= self._slots and not self._peers:
            self._stop.set()

    def _poll(self) -> None:
        up = _Mailbox(self._client, self.spec.bucket, f"{self.spec.key}/up/")
        while not self._stop.wait(POLL_S):
            try:
                for key in up.keys():
                    slot = int(key[len(up.prefix) :].split("/", 1)[0])
                    peer = self._peers.get(slot) or self._peer(slot)
                    messages = up.read(key)
                    up.delete(key)
                    peer.feed(messages)
            except Exception as e:  # the store is away: keep trying, say so once
                # In auto, before any task needed it, a missing bucket is no one's problem yet.
                needed = self.spec.always or bool(self._peers)
                if needed and not self._warned:
                    self._warned = True
                    logger.warning("the relay at %s could not be read: %s", self.spec.uri, e)
                else:
                    logger.debug("the relay at %s could not be read: %s", self.spec.uri, e)

    def _peer(self, slot: int) -> DriverPeer:
        writer = _Writer(self._client, self.spec.bucket, self.spec.mailbox("down", slot))
        peer = self._peers[slot] = DriverPeer(writer, slot)
        threading.Thread(
            target=self._serve, args=(peer,), daemon=True, name=f"hvdflow-relay-{slot}"
        ).start()
        return peer

    def close(self) -> None:
        """Stop reading, give the tasks told to close a moment to read it, remove the objects."""
        self._stop.set()
        self._thread.join(timeout=10)
        down = _Mailbox(self._client, self.spec.bucket, f"{self.spec.key}/down/")
        if any(peer.told_to_close for peer in self._peers.values()):
            deadline = time.monotonic() + CLOSE_WAIT_S
            while time.monotonic() < deadline and _quietly(down.keys):
                time.sleep(POLL_S / 2)
        everything = _Mailbox(self._client, self.spec.bucket, f"{self.spec.key}/")
        for key in _quietly(everything.keys) or []:
            _quietly(lambda key=key: self._client.delete_object(Bucket=self.spec.bucket, Key=key))


def _quietly(call):
    try:
        return call()
    except Exception as e:
        logger.debug("relay clean-up: %s", e)
        return None
