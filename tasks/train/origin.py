"""Where a training came from: the orchestrator's run that started it, as one frozen record.
Each face builds it from its own run; it reaches the MLflow run's tags (a retried run of the same
origin resumes its MLflow run), the registered version's tags and its card."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunOrigin:
    """``kind``: what the model card calls such a run; ``url``: the run's page, where known
    (already without a login)."""

    orchestrator: str
    run_id: str
    kind: str
    url: str | None = None
