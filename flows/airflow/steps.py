"""The pipeline DAG's tasks, as they run in hvdflow's environment.

Airflow runs each task with ``@task.external_python``: a fresh Python of hvdflow's environment
calls ``run(step, *args)``, and the result goes back pickled as the task's XCom, so arguments and
results are small plain dicts and nothing here imports Airflow. What is printed is the task's log.

The steps are the Prefect flow's, around the same plain functions and validation; what Prefect
adds (caching, artifacts, events, concurrency) is done here by XCom, assets and max_active_runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys

from pydantic import ValidationError

from hvdflow.flows.airflow.form import nested_values
from hvdflow.flows.cli_support import InvalidParameters, describe_validation_error, one_line
from hvdflow.flows.params import PipelineParams, ScoreParams
from hvdflow.infra.launcher._driver import rank_logger
from hvdflow.infra.secrets import redact_url, tracking_login
from hvdflow.infra.spark import SparkProgress, get_spark
from hvdflow.infra.stdio import outlive_reader
from hvdflow.infra.storage.object_store import ObjectStoreConfig
from hvdflow.infra.tracking import check_reachable, tracking_uri
from hvdflow.tasks.preprocess.config import DatasetManifest
from hvdflow.tasks.preprocess.job import preprocess_reported
from hvdflow.tasks.score.job import score_images
from hvdflow.tasks.score.model import fetch_model
from hvdflow.tasks.score.record import record_scoring
from hvdflow.tasks.score.summary import scoring_summary
from hvdflow.tasks.train.origin import RunOrigin
from hvdflow.tasks.train.run import spark_for_ranks, train_and_track
from hvdflow.tasks.train.summary import (
    profile_lines,
    throughput_lines,
    training_summary,
)
from hvdflow.tasks.weights.stage import (
    StagedWeights,
    stage_into,
    staging_inputs,
    weights_wanted,
)

# The Airflow DAG run as a training's origin: its tag value and what the model card calls it.
ORCHESTRATOR, KIND = "airflow", "Airflow DAG run"

logger = logging.getLogger("hvdflow.airflow")


def run(step: str, *args):
    """Run step ``step`` with ``args``; its result. A failure's one-line reason is the last line
    of the task's log."""
    # A step whose Airflow worker died finishes alone (a retried train task then finds its run),
    # not dying on its next print.
    outlive_reader()
    _log_to_stdout()
    try:
        return STEPS[step](*args)
    except Exception as e:
        reason = str(e) if isinstance(e, InvalidParameters) else one_line(e)
        _say(f"hvdflow {step} failed: {reason}")
        raise


def validate(conf: dict | str) -> dict:
    """The pipeline's parameters from a DAG run's params (a dict, or its JSON), checked as
    ``hvdflow run`` checks them, JSON-ready; InvalidParameters names a bad one."""
    try:
        values = nested_values(json.loads(conf) if isinstance(conf, str) else conf)
        params = PipelineParams.model_validate(values)
    except ValidationError as e:
        raise InvalidParameters(describe_validation_error(PipelineParams, e)) from None
    except ValueError as e:
        raise InvalidParameters(str(e)) from None
    logger.info("parameters: %s", params.model_dump_json(exclude_defaults=True) or "defaults")
    return params.model_dump(mode="json")


def check_tracking() -> str:
    """The tracking server answers; its URI, without a login."""
    uri = tracking_uri()
    check_reachable(uri)
    logger.info("tracking server %s answers", redact_url(uri))
    return redact_url(uri)


def preprocess(params: dict) -> dict:
    """Step 1: the dataset (reused when its fingerprint was published before)."""
    pipeline = _pipeline(params)
    config = pipeline.data.preprocess_config(ranks=pipeline.launcher.np)
    # Spark starts only when there is a dataset to make: a published one is found without it.
    master = pipeline.launcher.spark_master
    manifest = preprocess_reported(lambda: get_spark(master), config, logger)
    return dataclasses.asdict(manifest)


def stage_weights(params: dict, dataset: dict) -> dict | None:
    """Step 2: the model's pretrained weights in the object store, once per source; None when
    the model trains from its seeded start (no weights source, or PyTorch)."""
    training = _pipeline(params).training
    if not weights_wanted(training):
        logger.info("no weights to stage: %s trains from its seeded start", training.model)
        return None
    config, inputs = ObjectStoreConfig.from_env(), staging_inputs(_manifest(dataset))
    master = _pipeline(params).launcher.spark_master
    staged = stage_into(config, training.model, training.weights_source, *inputs, master)
    logger.info("weights for %s at %s (sha256 %s)", staged.model, staged.uri, staged.sha256[:12])
    return dataclasses.asdict(staged)


def train(params: dict, dataset: dict, weights: dict | None, dag_run: dict) -> dict:
    """Steps 3 and 4: train with np ranks, track in MLflow, register; the training's summary
    (``hvdflow.tasks.train.summary``, as in the Prefect flow).

    ``dag_run``: the DAG run's ``dag_id``, ``run_id`` and page ``url``, which tag the MLflow run
    and the registered version (a task retried in the same DAG run resumes its MLflow run)."""
    pipeline = _pipeline(params)
    config = pipeline.train_config()
    np = config.launcher.np
    logger.info(
        "training %s with np=%d for %d epochs", config.training.model, np, config.training.epochs
    )
    with tracking_login(tracking_uri()) as uri:
        spark = spark_for_ranks(np, config.launcher.spark_master)
        manifest, staged = _manifest(dataset), StagedWeights(**weights) if weights else None
        run_id, url = f"{dag_run['dag_id']}/{dag_run['run_id']}", dag_run.get("url") or None
        origin = RunOrigin(ORCHESTRATOR, run_id, KIND, url)
        result = train_and_track(
            spark, config, manifest, uri, weights=staged, on_log_line=_print_line, origin=origin
        )
        summary = training_summary(result, config, dataset=manifest, weights=staged, origin=origin)
    for line in throughput_lines(summary) + profile_lines(summary):
        logger.info("%s", line)
    return summary


def score(score_params: dict, version: str, origin_run_id: str | None = None) -> dict:
    """Score ``score_params``'s input with version ``version`` of its model (the champion the
    asset event named) and record it in MLflow; the scoring summary, as in the Prefect flow.
    ``origin_run_id``: the DAG run's ``dag_id/run_id``."""
    model = {**score_params.get("model", {}), "version": str(version)}
    model.pop("alias", None)  # the version the event named, not whatever holds the alias now
    params = ScoreParams.model_validate({**score_params, "model": model})
    config = params.score_config()
    with tracking_login(tracking_uri()) as uri:
        check_reachable(uri)
        scoring_model = fetch_model(params.model, uri)
        spark = get_spark(params.spark_master)
        logger.info("scoring %s with %s", config.input, scoring_model.uri)
        with SparkProgress(spark, logger):
            result = score_images(spark, config, scoring_model)
        recorded = record_scoring(uri, params.experiment, scoring_model, config, result)
    logger.info("%d images scored into %s", result.scored, result.predictions_url)
    return scoring_summary(
        scoring_model,
        config,
        result,
        recorded,
        tracking_uri=uri,
        asked=params.model.uri,
        origin_run_id=origin_run_id,
    )


STEPS = {
    "validate": validate,
    "check_tracking": check_tracking,
    "preprocess": preprocess,
    "stage_weights": stage_weights,
    "train": train,
    "score": score,
}


def _pipeline(params: dict):
    return PipelineParams.model_validate(params)


def _manifest(dataset: dict):
    return DatasetManifest(**{**dataset, "image_shape": tuple(dataset["image_shape"])})


def _print_line(line) -> None:
    # Every rank's lines, rank-prefixed, into the task's log (Airflow reads this process's stdout).
    _say(line.formatted())


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _log_to_stdout() -> None:
    """hvdflow's log records on stdout, which Airflow copies into the task's log line by line."""
    root = logging.getLogger()
    if not any(getattr(h, "_hvdflow_airflow", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        # _print_line prints every rank line; the rank logger's copy would print them twice.
        handler.addFilter(lambda record: record.name != rank_logger.name)
        handler._hvdflow_airflow = True
        root.addHandler(handler)
    root.setLevel(logging.INFO)
