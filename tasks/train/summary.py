"""A tracked training's summary, written once for every face: each orchestrator's pipeline run
returns it (``hvdflow run`` prints it), and every face shows the same throughput words."""

from __future__ import annotations

import logging

from hvdflow.infra.secrets import redact_url
from hvdflow.tasks.train.config import TrainConfig
from hvdflow.tasks.train.model_card import STEADY_METRIC
from hvdflow.tasks.train.origin import RunOrigin
from hvdflow.tasks.train.run import TrainResult
from hvdflow.training.profiling import breakdown_from_metrics, describe_breakdown

log = logging.getLogger(__name__)


def logged_metrics(uri: str, run_id: str) -> dict[str, float]:
    """The last value of each metric of MLflow run ``run_id``; none when the server does not
    answer (the summary goes without them: the run is done)."""
    from mlflow import MlflowClient  # noqa: PLC0415 (lazy: it loads MLflow)

    try:
        return MlflowClient(uri).get_run(run_id).data.metrics
    except Exception as e:
        log.warning("could not read the metrics of MLflow run %s: %s", run_id, e)
        return {}


def training_summary(
    result: TrainResult,
    config: TrainConfig,
    *,
    dataset=None,
    weights=None,
    origin: RunOrigin | None = None,
    metrics: dict[str, float] | None = None,
) -> dict:
    """``result`` of training ``config`` as plain values (the tracking URI without its login).

    ``dataset``: the run's ``DatasetManifest``; ``weights``: its ``StagedWeights`` or None;
    ``origin``: the orchestrator's run; ``metrics``: the MLflow run's last values (None: read
    from the run, inside the face's ``tracking_login``)."""
    if metrics is None:
        metrics = logged_metrics(result.tracking_uri, result.run_id)
    registered_model = config.tracking.registered_model_name
    profile_batches = tuple(config.training.profile_batches)
    base = redact_url(result.tracking_uri).rstrip("/")
    http = base.startswith("http")
    version = result.model_version
    steady = metrics.get(STEADY_METRIC)
    # Only a profile this training asked for: a resumed run holds its earlier attempts' metrics.
    asked = tuple(profile_batches) != (0, 0)
    profile = breakdown_from_metrics(metrics) if asked else None
    return {
        "flow_run_id": origin.run_id if origin else None,
        "flow_run_url": origin.url if origin else None,
        "dataset": dataset.path if dataset else None,
        "train_rows": dataset.train_rows if dataset else None,
        "val_rows": dataset.val_rows if dataset else None,
        "quarantined": dataset.quarantined if dataset else None,
        "weights_uri": weights.uri if weights else None,
        "tracking_uri": base,
        "experiment_id": result.experiment_id,
        "mlflow_run_id": result.run_id,
        "mlflow_run_url": f"{base}/#/experiments/{result.experiment_id}/runs/{result.run_id}"
        if http
        else result.run_id,
        "registered_model": registered_model,
        "model_version": version,
        "model": f"models:/{registered_model}/{version}" if version else None,
        "model_url": f"{base}/#/models/{registered_model}/versions/{version}"
        if http and version
        else None,
        "aliases": list(result.aliases),
        "champion_moved": result.champion_moved,
        "attempts": result.attempts,
        # The training's own (warm-up left out), and the wall clock's (launch included).
        "steady_images_per_s": round(steady, 1) if steady is not None else None,
        "images_per_s": round(result.images_per_s, 1),
        "wall_clock_s": round(result.wall_clock_s, 1),
        "val_accuracy": (result.history.get("val_accuracy") or [None])[-1],
        # Where a step went, when training.profile_batches asked for TensorFlow's profile.
        "profile": {"batches": list(profile_batches), **profile} if profile else None,
    }


def throughput_lines(summary: dict, prefix: str = "") -> list[str]:
    """The run's two throughputs, each named for what it measures."""
    lines = []
    if summary.get("steady_images_per_s") is not None:
        lines.append(
            f"{prefix}training throughput (steady state): {summary['steady_images_per_s']} "
            "images/s (epochs after the first)"
        )
    lines.append(
        f"{prefix}wall clock incl. launch: {summary['images_per_s']} images/s, "
        f"{summary['wall_clock_s']} s"
    )
    return lines


def profile_lines(summary: dict, prefix: str = "") -> list[str]:
    """Where rank 0's profiled steps went, and where the profile is; none without a profile."""
    profile = summary.get("profile")
    if not profile:
        return []
    start, stop = profile["batches"]
    return [
        f"{prefix}profile of batches [{start}, {stop}) on rank 0: {describe_breakdown(profile)} "
        f"(the MLflow run's artifacts, profile/; TensorBoard's Profile tab reads a download)"
    ]
