"""The scoring flow's steps as Prefect tasks around the plain functions.

Retries sit on the tracking server's edge only (finding and downloading the model, recording
the run), and never repeat a ValueError: a missing alias or a model that does not fit the data
stays missing however often it is asked for. Scoring itself is not retried by Prefect: Spark
already retries its failed tasks, and a run that fails leaves no published output.
"""

from __future__ import annotations

from prefect import get_run_logger, task

from hvdflow.flows.prefect.spark_slots import spark_slots
from hvdflow.infra.spark import SparkProgress, get_spark
from hvdflow.tasks.edges import EDGE_RETRIES, EDGE_RETRY_DELAYS_S
from hvdflow.tasks.score.config import ModelRef, ScoreConfig
from hvdflow.tasks.score.job import ScoreResult, score_images
from hvdflow.tasks.score.model import ScoringModel, fetch_model
from hvdflow.tasks.score.record import record_scoring


def _unless_bad_value(_task, _task_run, state) -> bool:
    """Prefect's retry condition: retry what the environment may fix, not a ValueError."""
    try:
        error = state.result(raise_on_failure=False)
    except Exception:
        return True
    return not isinstance(error, ValueError)


@task(
    name="find-model",
    retries=EDGE_RETRIES,
    retry_delay_seconds=EDGE_RETRY_DELAYS_S,
    retry_condition_fn=_unless_bad_value,
)
def find_model_step(ref: ModelRef, tracking_uri: str) -> ScoringModel:
    model = fetch_model(ref, tracking_uri)
    get_run_logger().info(
        "%s is %s (run %s; %d classes, input %s)",
        ref.uri,
        model.uri,
        model.run_id,
        len(model.labels),
        model.input_shape,
    )
    return model


@task(name="score")
def score_step(
    config: ScoreConfig, model: ScoringModel, spark_master: str | None = None
) -> ScoreResult:
    logger = get_run_logger()
    spark = get_spark(spark_master)
    logger.info("scoring %s (%s) with %s", config.input, config.input_format, model.uri)
    # Scoring spreads over every core of the cluster: it takes them all, in turn with training.
    with spark_slots(spark, None, "scoring", logger), SparkProgress(spark, logger):
        result = score_images(spark, config, model)
    logger.info(
        "%d images scored into %s, %d quarantined, %.1f images/s",
        result.scored,
        result.predictions_url,
        result.quarantined,
        result.images_per_s,
    )
    return result


# The plain function itself, with retries: the step adds nothing else.
record_step = task(
    name="record-scoring",
    retries=EDGE_RETRIES,
    retry_delay_seconds=EDGE_RETRY_DELAYS_S,
    retry_condition_fn=_unless_bad_value,
)(record_scoring)
