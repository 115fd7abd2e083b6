"""``hvdflow status``: the services (up or down, where) and the last runs, in a few lines.

It reads the embedded services' state file or the variables that point elsewhere, asking each
once whether it answers; the pipeline experiment's last runs with their versions and aliases; and
where Prefect answers, each run's flow-run state. Nothing is started, and every question has a
short timeout: a service that is down makes its line say so, not the command hang.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hvdflow.infra import constants as c
from hvdflow.infra._env import temporary_env
from hvdflow.infra.secrets import redact_url
from hvdflow.tasks.train.tags import FLOW_RUN_TAG

# Seconds each service gets to answer: a busy one on a loaded machine may take a few.
PROBE_TIMEOUT_S = 5.0
# What the MLflow client may take per request here (it retries for minutes by default).
TRACKING_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
LABELS = {"s3": "object store (S3)", "mlflow": "MLflow UI", "prefect": "Prefect UI"}
# The variable that points a client at a service the user runs elsewhere.
EXTERNAL = {"s3": c.AWS_ENDPOINT_URL, "mlflow": c.MLFLOW_TRACKING_URI, "prefect": c.PREFECT_API_URL}


@dataclass(frozen=True)
class ServiceStatus:
    name: str  # s3, mlflow, prefect
    url: str | None  # what a person opens (the UI for Prefect); None: not configured
    up: bool
    source: str | None = None  # the variable it comes from; None: the embedded service


@dataclass(frozen=True)
class RunStatus:
    started_ms: int
    status: str  # MLflow's: RUNNING, FINISHED, FAILED, KILLED
    run_id: str
    version: str | None = None
    aliases: tuple[str, ...] = ()
    val_accuracy: float | None = None
    flow_run_id: str | None = None
    flow_run_state: str | None = None  # Prefect's state name, where Prefect answered


@dataclass
class Status:
    home: str
    services: list[ServiceStatus]
    model: str
    experiment: str
    runs: list[RunStatus] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> version
    problem: str | None = None  # why no runs could be read


def answers(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether an HTTP server answers at ``url``: any status counts (401, 403, 404 too)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def service_statuses(state: Mapping[str, dict], environ: Mapping[str, str]) -> list[ServiceStatus]:
    """Each service from the variable that points elsewhere, else the embedded one's state."""
    found = []
    for name in LABELS:
        source = EXTERNAL[name]
        url = environ.get(source) or (environ.get(c.AWS_ENDPOINT_URL_S3) if name == "s3" else None)
        if url:
            source = source if environ.get(source) else c.AWS_ENDPOINT_URL_S3
        else:
            source = None
            url = state.get(name, {}).get("url")
        if not url:
            found.append(ServiceStatus(name, None, False))
            continue
        bare = redact_url(url).rstrip("/")
        probe = {"s3": bare, "mlflow": f"{bare}/health", "prefect": f"{bare}/health"}[name]
        shown = bare.removesuffix("/api") if name == "prefect" else bare
        http = bare.startswith(("http://", "https://"))
        found.append(ServiceStatus(name, shown, http and answers(probe), source))
    return found


def last_runs(client, experiment: str, model: str, n: int) -> tuple[list[RunStatus], dict]:
    """The ``n`` newest runs of ``experiment`` with their versions of ``model``, and the
    model's aliases (alias -> version)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(experiment)
    if found is None:
        return [], {}
    runs = client.search_runs(
        [found.experiment_id], order_by=["attributes.start_time DESC"], max_results=n
    )
    try:
        registered = client.get_registered_model(model)
        aliases = dict(registered.aliases or {})
        versions = client.search_model_versions(f"name = '{model}'")
    except MlflowException:
        aliases, versions = {}, []
    by_run = {v.run_id: str(v.version) for v in versions}
    held: dict[str, list[str]] = {}
    for alias, version in aliases.items():
        held.setdefault(str(version), []).append(alias)
    statuses = []
    for run in runs:
        version = by_run.get(run.info.run_id)
        statuses.append(
            RunStatus(
                started_ms=run.info.start_time or 0,
                status=run.info.status,
                run_id=run.info.run_id,
                version=version,
                aliases=tuple(sorted(held.get(version, []))) if version else (),
                val_accuracy=run.data.metrics.get("val_accuracy"),
                flow_run_id=run.data.tags.get(FLOW_RUN_TAG),
            )
        )
    return statuses, {alias: str(v) for alias, v in aliases.items()}


def with_flow_run_states(runs: list[RunStatus], states: Mapping[str, str]) -> list[RunStatus]:
    """``runs`` with the Prefect state of each one's flow run, where ``states`` has it."""
    return [
        replace(r, flow_run_state=states.get(r.flow_run_id)) if r.flow_run_id else r for r in runs
    ]


def flow_run_states(api_url: str, auth_string: str | None, ids: list[str]) -> dict[str, str]:
    """Prefect's state name of each flow run in ``ids``, from the API at ``api_url``."""
    if not ids:
        return {}
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_REQUEST_TIMEOUT,
        PREFECT_API_URL,
        temporary_settings,
    )

    settings = {PREFECT_API_URL: api_url, PREFECT_API_REQUEST_TIMEOUT: 10.0}
    if auth_string:
        settings[PREFECT_API_AUTH_STRING] = auth_string
    with temporary_settings(settings), get_client(sync_client=True) as client:
        flow_runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids))
        )
    return {str(r.id): r.state.name for r in flow_runs if r.state is not None}


def render(status: Status) -> list[str]:
    """The lines ``hvdflow status`` prints."""
    lines = [f"services (HVDFLOW_HOME {status.home}):"]
    for s in status.services:
        if s.url is None:
            lines.append(f"  {LABELS[s.name]:<18} down  start it with: hvdflow up")
            continue
        where = f"  (from {s.source})" if s.source else ""
        lines.append(f"  {LABELS[s.name]:<18} {'up' if s.up else 'down':<5} {s.url}{where}")
    if status.problem:
        lines.append(f"last runs: {status.problem}")
        return lines
    holders = ", ".join(f"{a} version {v}" for a, v in sorted(status.aliases.items()))
    lines.append(f"model {status.model}: {holders or 'no version holds an alias yet'}")
    if not status.runs:
        lines.append(f"last runs: none in MLflow experiment '{status.experiment}'")
        return lines
    lines.append(f"last runs (MLflow experiment '{status.experiment}'):")
    for r in status.runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started_ms / 1000))
        version = f"version {r.version}" if r.version else "no model version"
        if r.aliases:
            version += f" ({', '.join(r.aliases)})"
        accuracy = f"val_accuracy {r.val_accuracy:.4f}" if r.val_accuracy is not None else ""
        flow = f"flow run {r.flow_run_state}" if r.flow_run_state else ""
        parts = [started, f"{r.status:<8}", f"{version:<28}", accuracy, flow, f"run {r.run_id}"]
        lines.append("  " + "  ".join(p for p in parts if p))
    return lines


def gather(
    services,
    environ: Mapping[str, str],
    model: str,
    experiment: str,
    n: int = 5,
) -> Status:
    """The status of ``services`` (a LocalServices) and of the last ``n`` runs."""
    service_list = service_statuses(services.state(), environ)
    status = Status(str(services.home), service_list, model, experiment)
    mlflow = next(s for s in service_list if s.name == "mlflow")
    if not mlflow.up:
        status.problem = "the MLflow server is down"
        return status
    # The embedded services' URLs and credentials, for what the environment does not set.
    env = {k: v for k, v in services.env().items() if k not in environ}
    tracking = environ.get(c.MLFLOW_TRACKING_URI) or env.get(c.MLFLOW_TRACKING_URI)
    with temporary_env({**env, **TRACKING_ENV, c.MLFLOW_TRACKING_URI: tracking}):
        from mlflow import MlflowClient

        try:
            runs, aliases = last_runs(MlflowClient(tracking), experiment, model, n)
        except Exception as e:
            status.problem = f"could not read them from MLflow ({type(e).__name__}: {e})"
            return status
    status.aliases = aliases
    prefect = next(s for s in service_list if s.name == "prefect")
    api_url = environ.get(c.PREFECT_API_URL) or env.get(c.PREFECT_API_URL)
    if prefect.up and api_url:
        auth = environ.get(c.PREFECT_API_AUTH_STRING) or env.get(c.PREFECT_API_AUTH_STRING)
        ids = [r.flow_run_id for r in runs if r.flow_run_id]
        try:
            runs = with_flow_run_states(runs, flow_run_states(api_url, auth, ids))
        except Exception:
            pass  # the MLflow side still says how each run ended
    status.runs = runs
    return status
