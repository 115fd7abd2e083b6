"""The end-to-end pipeline flow: preprocess, stage weights, train with HorovodRunner, track.

Runs from the command line (``hvdflow run``), on a schedule or from the Prefect UI
(``hvdflow serve``). Its defaults run on the embedded services with the bundled digits.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from hvdflow.flows.params import PipelineParams
from hvdflow.flows.prefect.origin import this_flow_run
from hvdflow.flows.prefect.orphan import outlive_worker
from hvdflow.flows.prefect.preprocess import preprocessed
from hvdflow.flows.prefect.results import shared_result_storage
from hvdflow.flows.prefect.train import check_tracking_step, train_step
from hvdflow.flows.prefect.weights import stage_weights_for
from hvdflow.infra.secrets import tracking_login
from hvdflow.infra.tracking import tracking_uri
from hvdflow.tasks.train.summary import (
    profile_lines,
    throughput_lines,
    training_summary,
)
from hvdflow.tasks.weights.stage import weights_wanted

DEFAULT_PARAMS = PipelineParams()


@flow(name="hvdflow-pipeline", log_prints=True)
def pipeline(params: PipelineParams = DEFAULT_PARAMS) -> dict:
    """Preprocess images, stage weights, train with Horovod on Spark, log and register."""
    outlive_worker()  # a run orphaned by its worker's death goes on, and leaves nothing
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
        config = params.train_config()
        train = train_step.with_options(result_storage=storage)
        result = train(config, dataset, weights, uri, master)
        summary = training_summary(
            result, config, dataset=dataset, weights=weights, origin=this_flow_run()
        )
    _publish_artifacts(summary, result)
    logger.info(
        "done: MLflow run %s, model version %s", summary["mlflow_run_url"], summary["model"]
    )
    return summary


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
