"""A scoring run's summary, written once for every face: each orchestrator's scoring run
returns it, and ``hvdflow score`` prints it."""

from __future__ import annotations

from hvdflow.infra.secrets import redact_url
from hvdflow.tasks.score.config import ScoreConfig
from hvdflow.tasks.score.job import ScoreResult
from hvdflow.tasks.score.model import ScoringModel


def scoring_summary(
    model: ScoringModel,
    config: ScoreConfig,
    result: ScoreResult,
    recorded: tuple[str, str],
    *,
    tracking_uri: str,
    asked: str,
    origin_run_id: str | None = None,
) -> dict:
    """``result`` as plain values; ``asked``: the model URI the user named (an alias, say);
    ``recorded``: (run id, experiment id) from ``record_scoring``; ``origin_run_id``: the
    orchestrator's run."""
    run_id, experiment_id = recorded
    base = redact_url(tracking_uri).rstrip("/")
    http = base.startswith("http")
    return {
        "flow_run_id": origin_run_id,
        "model": model.uri,
        "model_asked": asked,
        "model_version": model.version,
        "model_url": f"{base}/#/models/{model.name}/versions/{model.version}" if http else None,
        "mlflow_run_id": run_id,
        "mlflow_run_url": f"{base}/#/experiments/{experiment_id}/runs/{run_id}" if http else run_id,
        "input": config.input,
        "output": result.output,
        "predictions": result.predictions_url,
        "scored": result.scored,
        "quarantined": result.quarantined,
        "quarantine_path": result.quarantine_path,
        "counts": dict(result.counts),
        "images_per_s": round(result.images_per_s, 1),
        "executors": result.executors,
    }
