"""The scoring flow: predictions for new images with a registered model, on Spark.

Runs from the command line (``hvdflow score``), on a schedule or from the Prefect UI
(``hvdflow score --serve``). By default it scores with ``models:/hvdflow-classifier@champion``,
the version the pipeline last promoted.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from hvdflow.flows.params import ScoreParams
from hvdflow.flows.prefect.orphan import outlive_worker
from hvdflow.flows.prefect.score import find_model_step, record_step, score_step
from hvdflow.flows.prefect.train import check_tracking_step
from hvdflow.infra.secrets import tracking_login
from hvdflow.infra.tracking import tracking_uri
from hvdflow.tasks.score.summary import scoring_summary

ARTIFACT_KEY = "hvdflow-score-summary"


@flow(name="hvdflow-score", log_prints=True)
def score(params: ScoreParams) -> dict:
    """Find the model version, score the inputs on Spark, publish, and record it in MLflow."""
    outlive_worker()  # a run orphaned by its worker's death goes on, and leaves nothing
    logger = get_run_logger()
    config = params.score_config()
    with tracking_login(tracking_uri()) as uri:
        check_tracking_step(uri)
        model = find_model_step(params.model, uri)
        result = score_step(config, model, params.spark_master)
        recorded = record_step(uri, params.experiment, model, config, result)
    this_run = str(flow_run.get_id()) if flow_run.get_id() else None
    summary = scoring_summary(
        model,
        config,
        result,
        recorded,
        tracking_uri=uri,
        asked=params.model.uri,
        origin_run_id=this_run,
    )
    create_markdown_artifact(
        key=ARTIFACT_KEY, description="Predictions per class", markdown=summary_markdown(summary)
    )
    logger.info("done: %d images scored with %s", result.scored, model.uri)
    return summary


def summary_markdown(summary: dict) -> str:
    """The Prefect artifact: the model version used, then images per predicted class."""
    model = summary["model"]
    model_link = f"[{model}]({summary['model_url']})" if summary["model_url"] else f"`{model}`"
    lines = [
        "# hvdflow scoring run",
        f"- Model: {model_link} (asked for `{summary['model_asked']}`), version "
        f"**{summary['model_version']}**",
        f"- MLflow run: [{summary['mlflow_run_id']}]({summary['mlflow_run_url']})",
        f"- Input: `{summary['input']}`: **{summary['scored']}** images scored, "
        f"**{summary['quarantined']}** quarantined (`{summary['quarantine_path']}`)",
        f"- Predictions: `{summary['predictions']}`",
        "",
        "| predicted class | images |",
        "|---|---|",
    ]
    for name, count in summary["counts"].items():
        lines.append(f"| {str(name).replace('|', chr(92) + '|')} | {count} |")
    return "\n".join(lines)
