"""One soak from start to end on a given cluster: the stack up, the plan run, everything
stopped, and the records returned; the services' variables set for this process meanwhile."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from hvdflow.infra._env import temporary_env
from tests.helpers import fresh_prefect_events_worker as _fresh_events_worker
from tests.soak.plan import PlannedRun
from tests.soak.runner import Soak
from tests.soak.stack import SERVICE_VARIABLES, SoakStack


def run_soak(
    cluster,
    workdir: Path,
    plan: list[PlannedRun],
    epochs: int,
    say: Callable[[str], None] | None = None,
    score_in_airflow: bool = False,
) -> Soak:
    """``say``: where the soak's progress lines go (default: printed with the time since
    the soak began, so that a slow step shows in the log)."""
    say = say or elapsed_printer(time.monotonic())
    stack = SoakStack(cluster, workdir)
    saved = {k: os.environ.pop(k) for k in SERVICE_VARIABLES if k in os.environ}
    soak = Soak(stack, plan, epochs, say=say, score_in_airflow=score_in_airflow)
    try:
        env = stack.start_services()
        _fresh_events_worker()  # what this process sent so far goes where it was meant to
        with temporary_env(env), _prefect_settings(env):
            try:
                soak.set_up()
                soak.run()
            finally:
                # Made under these settings, Prefect's events worker would go on sending
                # this process's events to the soak's server once stopped.
                _fresh_events_worker()
    finally:
        soak.log.stop()
        stack.stop_worker()
        stack.stop_connect()
        stack.remove_container_worker()
        stack.remove_worker_folders()
        airflow_left = [f"Airflow's {left}" for left in stack.stop_airflow()]
        soak.final_leftovers = airflow_left + _final_leftovers(soak)
        stack.stop_services()
        os.environ.update(saved)
    return soak


def elapsed_printer(started: float) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"[{time.monotonic() - started:7.1f} s] {line}", flush=True)

    return say


def _final_leftovers(soak: Soak) -> list[str]:
    from tests.soak import checks

    with contextlib.suppress(Exception):
        return checks.wait_for_no_leftovers(soak.stack)
    return ["could not look"]


@contextlib.contextmanager
def _prefect_settings(env: dict):
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    updates = {PREFECT_API_URL: env["PREFECT_API_URL"]}
    if "PREFECT_API_AUTH_STRING" in env:
        updates[PREFECT_API_AUTH_STRING] = env["PREFECT_API_AUTH_STRING"]
    with temporary_settings(updates):
        yield
