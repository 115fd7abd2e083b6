"""The session fixture for tests that need several hosts: ``netns_cluster``.

Where the harness cannot run (not root, no iproute2, no namespaces), its tests skip and say
why; under CI=true that is a failure instead, so CI cannot pass without running them.
"""

from __future__ import annotations

import signal
import threading

import pytest

from tests.cluster import cleanup, netns
from tests.cluster.spark_cluster import netns_spark_cluster
from tests.helpers import skip_here_fail_in_ci

# Bounds the cluster's start: namespaces, a master and two worker JVMs on two busy cores.
START_TIMEOUT_S = 120.0


def require_harness() -> None:
    """Skip (fail under CI=true) when the multi-host harness cannot run here."""
    reason = netns.unavailable_reason()
    if reason is None:
        return
    skip_here_fail_in_ci(reason, "the multi-host tests")


@pytest.fixture(scope="session")
def netns_cluster(tmp_path_factory):
    """A Spark master beside the driver and two one-core workers, each on its own host."""
    require_harness()
    # Leftovers of earlier runs that died; live runs (a person's `up` included) are left alone.
    for line in cleanup.down(stop_live=()):
        if not line.startswith("left live"):
            print(f"tests.cluster: {line}")
    with _sigterm_as_interrupt():
        with netns_spark_cluster(
            tmp_path_factory.mktemp("netns-cluster"), workers=2, cores=1, timeout_s=START_TIMEOUT_S
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
