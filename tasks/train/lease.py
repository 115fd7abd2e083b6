"""A training's claim on its MLflow run while its driver lives: no second driver trains it too.

An orchestrator can start a run's training step again while the first still trains (it fails a
task whose worker's heartbeat stopped, yet hvdflow's step goes on). So the training driver
stamps the run every ``REFRESH_S``, and a step about to continue a RUNNING run of its origin
waits while the stamp is fresh. The stamp is the driver's clock: drivers whose clocks differ by
more than ``STALE_S - REFRESH_S`` would misjudge each other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time

logger = logging.getLogger(__name__)

DRIVER_TAG = "hvdflow.driver"  # host:pid of the driver training the run
ALIVE_TAG = "hvdflow.driver_alive_at"  # when it last said so (seconds since the epoch)
REFRESH_S = 10.0
# A stamp older than this: its driver is gone. Longer than a tracking-server restart (~20 s).
STALE_S = 60.0
POLL_S = 5.0


def this_driver() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@contextlib.contextmanager
def driver_lease(client, run_id: str):
    """Stamp run ``run_id`` as trained by this process, every REFRESH_S until the block ends.
    A refresh that fails (the tracking server restarting) is tried again at the next tick."""
    stop = threading.Event()
    client.set_tag(run_id, DRIVER_TAG, this_driver())

    def refresh() -> None:
        while True:
            with contextlib.suppress(Exception):
                client.set_tag(run_id, ALIVE_TAG, f"{time.time():.0f}")
            if stop.wait(REFRESH_S):
                return

    thread = threading.Thread(target=refresh, name=f"hvdflow-lease-{run_id[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(REFRESH_S)


def live_driver(run) -> str | None:
    """The driver that holds RUNNING MLflow run ``run`` now (its stamp is fresh), else None."""
    if run.info.status != "RUNNING":
        return None
    tags = run.data.tags
    try:
        alive_at = float(tags[ALIVE_TAG])
    except (KeyError, ValueError):
        return None  # never stamped (an older hvdflow, or killed before its first stamp)
    if time.time() - alive_at > STALE_S or tags.get(DRIVER_TAG) == this_driver():
        return None
    return tags.get(DRIVER_TAG, "another driver")


def wait_while_held(client, run_id: str, what: str, poll_s: float = POLL_S) -> bool:
    """Return once MLflow run ``run_id`` is held by no live driver (ended, or stamp stale);
    whether it had to wait. ``what`` names the orchestrator's run, for the log."""
    said, waited = 0.0, False
    while (driver := live_driver(client.get_run(run_id))) is not None:
        waited = True
        if time.monotonic() - said > 60:
            logger.warning(
                "%s: MLflow run %s is still being trained by %s (a first execution of this "
                "step, which outlived its orchestrator's worker): waiting for it to end rather "
                "than train it twice",
                what,
                run_id,
                driver,
            )
            said = time.monotonic()
        time.sleep(poll_s)
    return waited
