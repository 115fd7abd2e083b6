"""The end-to-end pipeline flow: preprocess, stage weights, train with HorovodRunner, track.

Runs from the command line (``hvdflow run``), on a schedule or from the Prefect UI
(``hvdflow serve``). Its defaults run on the embedded services with the bundled digits.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run

from hvdflow.flows.params import PipelineParams
from hvdflow.flows.prefect.origin import flow_run_url
from hvdflow.flows.prefect.preprocess import preprocessed
from hvdflow.flows.prefect.results import shared_result_storage
from hvdflow.flows.prefect.train import check_tracking_step, train_step
from hvdflow.flows.prefect.weights import stage_weights_for
from hvdflow.infra.secrets import redact_url, tracking_login
from hvdflow.infra.tracking import tracking_uri
from hvdflow.tasks.train.model_card import STEADY_METRIC
from hvdflow.tasks.weights.stage import weights_wanted
from hvdflow.training.profiling import breakdown_from_metrics, describe_breakdown

DEFAULT_PARAMS = PipelineParams()


@flow(name="hvdflow-pipeline", log_prints=True)
def pipeline(params: PipelineParams = DEFAULT_PARAMS) -> dict:
    """Preprocess images, stage weights, train with Horovod on Spark, log and register."""
    logger = get_run_logger()
    # A user:password in the tracking URI goes to MLflow's login variables for the run: no task
    # input, result or printed link carries it.
    with tracking_login(tracking_uri()) as uri:
        check_tracking_step(uri)
        # Results and cache records in the object store: a rerun on another worker reuses them.
        storage = shared_result_storage()
        master = params.launcher.spark_master
        data = params.data.preprocess_config(ranks=params.launcher.np)
        dataset = preprocessed(data, master, storage)
        weights = None
        if weights_wanted(params.training):
            # A reference (env:NAME, secret:block-name) is resolved inside the task, on the driver.
            weights = stage_weights_for(
                params.training.model,
                params.training.weights_source,
                dataset,
                storage,
                spark_master=master,
            )
        train = train_step.with_options(result_storage=storage)
        result = train(params.train_config(), dataset, weights, uri, master)
        metrics = _logged_metrics(uri, result.run_id)
    summary = _summary(params, dataset, weights, result, metrics)
    _publish_artifacts(summary, result)
    logger.info(
        "done: MLflow run %s, model version %s", summary["mlflow_run_url"], summary["model"]
    )
    return summary


def _logged_metrics(uri: str, run_id: str) -> dict[str, float]:
    """The last value of each metric MLflow run ``run_id`` logged; none when the tracking server
    does not answer now (the summary goes without them: the run is done)."""
    from mlflow import MlflowClient  # noqa: PLC0415 (lazy: it loads MLflow)

    try:
        return MlflowClient(uri).get_run(run_id).data.metrics
    except Exception as e:
        get_run_logger().warning("could not read the metrics of MLflow run %s: %s", run_id, e)
        return {}


def _summary(params, dataset, weights, result, metrics: dict[str, float]) -> dict:
    base = redact_url(result.tracking_uri).rstrip("/")
    http = base.startswith("http")
    name = params.tracking.registered_model_name
    flow_run_id = str(flow_run.get_id()) if flow_run.get_id() else None
    steady = metrics.get(STEADY_METRIC)
    # Only a profile this training asked for: a resumed run holds its earlier attempts' metrics.
    asked = tuple(params.training.profile_batches) != (0, 0)
    profile = breakdown_from_metrics(metrics) if asked else None
    return {
        "flow_run_id": flow_run_id,
        "flow_run_url": flow_run_url(flow_run_id),
        "dataset": dataset.path,
        "train_rows": dataset.train_rows,
        "val_rows": dataset.val_rows,
        "quarantined": dataset.quarantined,
        "weights_uri": weights.uri if weights else None,
        "mlflow_run_id": result.run_id,
        "mlflow_run_url": f"{base}/#/experiments/{result.experiment_id}/runs/{result.run_id}"
        if http
        else result.run_id,
        "model": f"models:/{name}/{result.model_version}",
        "model_url": f"{base}/#/models/{name}/versions/{result.model_version}" if http else None,
        "aliases": result.aliases,
        # Two throughputs: the training's own (epochs after the first, the warm-up left out) and
        # the wall clock's, which also counts launching the ranks and the first epoch.
        "steady_images_per_s": round(steady, 1) if steady is not None else None,
        "images_per_s": round(result.images_per_s, 1),
        "wall_clock_s": round(result.wall_clock_s, 1),
        "val_accuracy": result.history.get("val_accuracy", [None])[-1],
        # Where a step went, when training.profile_batches asked for TensorFlow's profile.
        "profile": {"batches": list(params.training.profile_batches), **profile}
        if profile
        else None,
    }


def _publish_artifacts(summary: dict, result) -> None:
    rows = []
    for epoch, seconds in enumerate(result.epoch_times):
        log_s = result.epoch_times_log[epoch] if epoch < len(result.epoch_times_log) else None
        rows.append(
            {
                "epoch": epoch + 1,
                "epoch_time_s (callback)": round(seconds, 3),
                "epoch_time_s (log method)": round(log_s, 3) if log_s is not None else "",
                "val_accuracy": round(result.history.get("val_accuracy", [0] * 99)[epoch], 4),
            }
        )
    create_table_artifact(rows, key="hvdflow-timings", description="Epoch times and accuracy")
    model_link = summary["model_url"] or summary["model"]
    create_markdown_artifact(
        key="hvdflow-summary",
        description="Where the results are",
        markdown="\n".join(
            [
                "# hvdflow pipeline run",
                f"- MLflow run: [{summary['mlflow_run_id']}]({summary['mlflow_run_url']})",
                f"- Registered model: [{summary['model']}]({model_link}), aliases "
                f"{', '.join(summary['aliases']) or 'none'}",
                f"- Dataset: `{summary['dataset']}` ({summary['train_rows']} train, "
                f"{summary['val_rows']} val)",
                f"- Quarantined inputs: **{summary['quarantined']}**",
                *throughput_lines(summary, "- "),
                *profile_lines(summary, "- "),
            ]
        ),
    )


def throughput_lines(summary: dict, prefix: str = "") -> list[str]:
    """The run's two throughputs, each named for what it measures (the summary artifact and
    ``hvdflow run`` show the same words)."""
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
