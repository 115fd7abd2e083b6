"""The Prefect flow run as a training's origin (``hvdflow.tasks.train.origin``)."""

from __future__ import annotations

from prefect.runtime import flow_run
from prefect.utilities.urls import url_for

from hvdflow.infra.secrets import redact_url
from hvdflow.tasks.train.origin import RunOrigin

ORCHESTRATOR = "prefect"
KIND = "Prefect flow run"


def flow_run_url(flow_run_id: str | None) -> str | None:
    """The Prefect UI page of ``flow_run_id``: under ``PREFECT_UI_URL``, which Prefect derives
    from ``PREFECT_API_URL`` when unset; None for no flow run or a UI-less (ephemeral) API."""
    if not flow_run_id:
        return None
    url = url_for("flow-run", obj_id=str(flow_run_id))
    return redact_url(url) if url else None


def this_flow_run() -> RunOrigin | None:
    """The flow run this code runs in, with its page; None outside a flow run."""
    run_id = flow_run.get_id()
    if not run_id:
        return None
    return RunOrigin(ORCHESTRATOR, str(run_id), KIND, flow_run_url(str(run_id)))
