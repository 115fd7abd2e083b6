"""The embedded SeaweedFS checks access keys: refused without them or with wrong ones."""

from __future__ import annotations

from pathlib import Path

import boto3
import grpc
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

pytestmark = pytest.mark.integration

BUCKET = "hvdflow-keys"


def s3_client(endpoint_url: str, key: str | None = None, secret: str | None = None, **config):
    """A boto3 client with exactly these keys (none: pass signature_version=UNSIGNED)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}, **config),
    )


def refusal(call) -> tuple[int, str]:
    """The HTTP status and error code with which the server refuses ``call()``."""
    with pytest.raises(ClientError) as err:
        call()
    response = err.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


@pytest.fixture
def owner(seaweed):
    """A client with the server's own keys, and a bucket with one object in it."""
    credentials = seaweed.credentials
    client = s3_client(
        seaweed.endpoint_url, credentials.access_key_id, credentials.secret_access_key
    )
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="kept.txt", Body=b"kept")
    return client


def test_a_request_without_a_key_is_refused(seaweed, owner):
    anonymous = s3_client(seaweed.endpoint_url, signature_version=UNSIGNED)
    assert refusal(anonymous.list_buckets) == (403, "AccessDenied")
    assert refusal(lambda: anonymous.get_object(Bucket=BUCKET, Key="kept.txt")) == (
        403,
        "AccessDenied",
    )
    assert refusal(lambda: anonymous.put_object(Bucket=BUCKET, Key="x.txt", Body=b"x")) == (
        403,
        "AccessDenied",
    )
    assert [o["Key"] for o in owner.list_objects_v2(Bucket=BUCKET)["Contents"]] == ["kept.txt"]


def test_a_wrong_key_or_a_wrong_secret_is_refused(seaweed, owner):
    credentials = seaweed.credentials
    unknown_key = s3_client(seaweed.endpoint_url, "AKIDNOTTHEKEY", credentials.secret_access_key)
    wrong_secret = s3_client(seaweed.endpoint_url, credentials.access_key_id, "not-the-secret")
    assert refusal(unknown_key.list_buckets) == (403, "InvalidAccessKeyId")
    assert refusal(wrong_secret.list_buckets) == (403, "SignatureDoesNotMatch")
    assert refusal(lambda: wrong_secret.put_object(Bucket=BUCKET, Key="x.txt", Body=b"x")) == (
        403,
        "SignatureDoesNotMatch",
    )
    assert owner.get_object(Bucket=BUCKET, Key="kept.txt")["Body"].read() == b"kept"


def test_the_keys_it_hands_to_clients_are_accepted(seaweed, owner):
    env = seaweed.env()
    client = s3_client(
        env["AWS_ENDPOINT_URL"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    )
    client.put_object(Bucket=BUCKET, Key="mine.txt", Body=b"mine")
    assert client.get_object(Bucket=BUCKET, Key="mine.txt")["Body"].read() == b"mine"


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (payloads here are < 128 bytes)."""
    assert len(payload) < 128
    return bytes([(number << 3) | 2, len(payload)]) + payload


def test_its_grpc_port_does_not_take_an_identity_without_a_client_certificate(seaweed, owner):
    # SeaweedFS's S3 gateway takes identity updates on its gRPC port, which listens on the
    # bind address too; without the server's client certificate nobody gets that far.
    flags = _flags(seaweed)
    identity = (
        _field(1, b"intruder")
        + _field(2, _field(1, b"INTRUDERKEY") + _field(2, b"intruder-secret"))
        + _field(3, b"Admin")
    )
    with grpc.insecure_channel(f"127.0.0.1:{flags['-s3.port.grpc']}") as channel:
        put_identity = channel.unary_unary(
            "/messaging_pb.SeaweedS3IamCache/PutIdentity",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as err:
            put_identity(_field(1, identity), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    intruder = s3_client(seaweed.endpoint_url, "INTRUDERKEY", "intruder-secret")
    assert refusal(intruder.list_buckets) == (403, "InvalidAccessKeyId")


def test_every_port_it_listens_on_is_one_it_was_given_below_the_ephemeral_range(seaweed, owner):
    # A port it chose itself (gRPC's HTTP port + 10000) could lie in the range outgoing
    # connections draw from, and one of them take it first: a CI run's "failed to listen on
    # grpc port 33524". Each port is named on its command line, picked below that range.
    import psutil

    from hvdflow.infra.ports import ephemeral_start

    named = {int(v) for k, v in _flags(seaweed).items() if ".port" in k and v != "0"}
    listening = {
        c.laddr.port
        for c in psutil.Process(seaweed.process.pid).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    }
    assert len(named) == 8  # master, volume, filer, S3: HTTP and gRPC each
    assert seaweed.port in named and listening <= named
    assert max(named) < ephemeral_start()


def _flags(seaweed) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in seaweed.process.args if "=" in arg)


def test_its_unix_sockets_in_tmp_go_when_it_stops_or_at_the_next_start_after_a_kill(tmp_path):
    """`weed server` leaves its /tmp/seaweedfs-*.sock behind; the wrapper removes them."""
    import signal

    from hvdflow.infra.services.seaweed import SeaweedServer, recorded_unix_sockets

    def sockets() -> list[Path]:
        return [p for p in recorded_unix_sockets(tmp_path) if p.is_socket()]

    server = SeaweedServer(tmp_path).start()
    try:
        killed = sockets()
        assert killed, "expected SeaweedFS to serve on unix sockets in /tmp"
        server.process.send_signal(signal.SIGKILL)  # no stop(): what a crash or OOM kill does
        server.process.wait(10)
        assert all(p.is_socket() for p in killed)

        server.start()  # the next start removes the killed one's (not the S3 port's: kept)
        running = sockets()
        assert not any(p.is_socket() for p in killed if p not in running)
        assert len(set(killed) - set(running)) >= 3  # the master's, volume's and filer's moved
    finally:
        server.stop()
    assert running and not any(p.is_socket() for p in running)
