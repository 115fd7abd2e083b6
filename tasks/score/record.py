"""What MLflow keeps of a scoring run: the model version, input and output as params, the
images scored, quarantined and per class as metrics, the summary as an artifact; and tags on
the model version naming its latest scoring run and output.
"""

from __future__ import annotations

import re

import mlflow
from mlflow import MlflowClient

from hvdflow.tasks.score.config import ScoreConfig
from hvdflow.tasks.score.job import ScoreResult
from hvdflow.tasks.score.model import ScoringModel

KIND_TAG = "hvdflow.kind"
LAST_RUN_TAG = "hvdflow.last_scoring_run"
LAST_OUTPUT_TAG = "hvdflow.last_scoring_output"


def metric_name(class_name: str) -> str:
    """``count/<class>``, with what MLflow refuses in a metric name replaced by ``_``."""
    return "count/" + re.sub(r"[^A-Za-z0-9_\-. /]", "_", class_name)


def record_scoring(
    tracking_uri: str,
    experiment: str,
    model: ScoringModel,
    config: ScoreConfig,
    result: ScoreResult,
) -> tuple[str, str]:
    """Log the scoring run and tag the model version; returns (run id, experiment id)."""
    mlflow.set_tracking_uri(tracking_uri)
    found = mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"score {model.name} v{model.version}") as run:
        mlflow.set_tags(
            {KIND_TAG: "scoring", "model_name": model.name, "model_version": model.version}
        )
        mlflow.log_params(
            {
                "model_name": model.name,
                "model_version": model.version,
                "model_uri": model.uri,
                "model_run_id": model.run_id or "none",
                "model_aliases": ",".join(model.aliases) or "none",
                "input": config.input,
                "input_format": config.input_format,
                "output": result.output,
                "predictions_url": result.predictions_url,
                "batch_size": config.batch_size,
            }
        )
        metrics = {
            "images_scored": result.scored,
            "quarantined": result.quarantined,
            "wall_clock_s": result.seconds,
            "images_per_s": result.images_per_s,
        }
        metrics.update({metric_name(name): n for name, n in result.counts.items()})
        mlflow.log_metrics(metrics)
        mlflow.log_dict(
            {
                "model": model.uri,
                "input": config.input,
                "predictions_url": result.predictions_url,
                "quarantine_path": result.quarantine_path,
                "counts": result.counts,
                "executors": result.executors,
            },
            "scoring/summary.json",
        )
        run_id = run.info.run_id
    if model.run_id:  # a registered version (not a local model)
        client = MlflowClient(tracking_uri)
        client.set_model_version_tag(model.name, model.version, LAST_RUN_TAG, run_id)
        client.set_model_version_tag(model.name, model.version, LAST_OUTPUT_TAG, result.output)
    return run_id, found.experiment_id
