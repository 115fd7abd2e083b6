"""The session fixtures for tests that need several hosts: ``netns_cluster``, and the services
bound to its driver with raw images in their bucket, ``cluster_services``.

Where the harness cannot run (not root, no iproute2, no namespaces), its tests skip and say
why; under CI=true that is a failure instead, so CI cannot pass without running them.
"""

from __future__ import annotations

import io
import os
import signal
import threading

import pytest

from tests.cluster import cleanup, netns
from tests.cluster.spark_cluster import netns_spark_cluster
from tests.helpers import skip_here_fail_in_ci

# Bounds the cluster's start: namespaces, a master and two worker JVMs on two busy cores.
START_TIMEOUT_S = 120.0

IMAGES_PER_CLASS = 12
BAD = {
    "3/truncated.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",  # a PNG cut off in its header
    "7/saved-page.jpg": b"<!DOCTYPE html><html><body>Too Many Requests</body></html>",
}


def require_harness() -> None:
    """Skip (fail under CI=true) when the multi-host harness cannot run here."""
    reason = netns.unavailable_reason()
    if reason is None:
        return
    skip_here_fail_in_ci(reason, "the multi-host tests")


@pytest.fixture(scope="session")
def netns_cluster(tmp_path_factory):
    """A Spark master beside the driver and two one-core workers, each on its own host; and a
    third host with no worker, for the test of a host that joins (``start_worker``)."""
    require_harness()
    # Leftovers of earlier runs that died; live runs (a person's `up` included) are left alone.
    for line in cleanup.down(stop_live=()):
        if not line.startswith("left live"):
            print(f"tests.cluster: {line}")
    with _sigterm_as_interrupt():
        with netns_spark_cluster(
            tmp_path_factory.mktemp("netns-cluster"),
            workers=2,
            cores=1,
            spare=1,
            timeout_s=START_TIMEOUT_S,
        ) as cluster:
            yield cluster


class _sigterm_as_interrupt:
    """SIGTERM becomes KeyboardInterrupt, so pytest stops and tears the cluster down.

    Python's default SIGTERM ends the process at once, skipping every finally.
    """

    def __enter__(self):
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, _interrupt)

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def upload_raw_images(store, prefix: str, per_class: int = IMAGES_PER_CLASS) -> int:
    """A class-folder tree of real digits (PNG) plus the bad objects; returns the good count."""
    from PIL import Image

    from hvdflow.training.digits import bundled_digits

    images, labels = bundled_digits()
    counts: dict[int, int] = {}
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        if counts.get(label, 0) == per_class:
            continue
        counts[label] = counts.get(label, 0) + 1
        buffer = io.BytesIO()
        Image.fromarray((image * 255 / 16).astype("uint8"), mode="L").save(buffer, "PNG")
        store.put_bytes(buffer.getvalue(), f"{prefix}{label}/digit_{i:04d}.png", "image/png")
    for name, data in BAD.items():
        store.put_bytes(data, prefix + name, "application/octet-stream")
    return sum(counts.values())


@pytest.fixture(scope="session")
def cluster_services(netns_cluster, tmp_path_factory):
    """hvdflow up --bind on the driver's address: S3, MLflow and Prefect with credentials,
    and raw images (some bad) in the bucket. Yields (home, env, good images). One for the
    session: the pipeline and scoring tests on the cluster share it (their models differ)."""
    from hvdflow.infra._env import temporary_env
    from hvdflow.infra.services.local import LocalServices
    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

    home = tmp_path_factory.mktemp("cluster-home")
    services = LocalServices(home)
    # The cluster's own services, not the session's: LocalServices skips what these name.
    hidden = ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")
    saved = {k: os.environ.pop(k) for k in hidden if k in os.environ}
    try:
        env = services.up(bind=netns_cluster.driver_ip)
    finally:
        os.environ.update(saved)
    try:
        with temporary_env(env):
            store = ObjectStore(ObjectStoreConfig.from_env(bucket="hvdflow"))
            store.ensure_bucket()
            good = upload_raw_images(store, "s3://hvdflow/raw/digits/")
        yield home, env, good
    finally:
        services.down()
