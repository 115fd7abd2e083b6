"""Where a training came from: the orchestrator's run that started it, as one frozen record.

The steps know no orchestrator; each face (a folder under ``hvdflow.flows``) builds this record
from its own run and hands it down. It reaches the MLflow run's tags (a retried
run of the same origin resumes its MLflow run), the registered version's tags and its card.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunOrigin:
    """``orchestrator``: the tag value naming the orchestrator; ``run_id``: its run's id;
    ``kind``: what the model card calls such a run; ``url``: the run's page, where one is known
    (already without a login)."""

    orchestrator: str
    run_id: str
    kind: str
    url: str | None = None
