"""Which MLflow run a training continues, where its checkpoints go, and what it must match.

A training that failed transiently, or an orchestrator's run retried, continues its failed
MLflow run from the last checkpoint (``tracking.resume`` names one explicitly), with the same
parameters; epochs it could not log during a tracking-server outage are logged afterwards.
"""

from __future__ import annotations

import logging
import time

from mlflow import MlflowClient
from mlflow.entities import Metric

from hvdflow.tasks.train.tags import FLOW_RUN_TAG

logger = logging.getLogger(__name__)


def checkpoint_url_for(checkpoints: str, run_id: str) -> str | None:
    """Where the checkpoints of MLflow run ``run_id`` go (``TrainingParams.checkpoints``)."""
    if checkpoints == "off":
        return None
    if not checkpoints:
        from hvdflow.infra.storage.object_store import ObjectStoreConfig  # noqa: PLC0415 (lazy: it loads boto3)

        store = ObjectStoreConfig.from_env()
        return store.uri(store.key("checkpoints", run_id))
    return f"{checkpoints.rstrip('/')}/{run_id}"


def run_to_resume(
    tracking_uri: str, experiment_id: str, resume: str, flow_run_id: str | None
) -> str | None:
    """The MLflow run to continue: ``resume`` ('last' or a run id), else this flow run's failed
    one (the orchestrator's run retried), else None (a new run)."""
    client = MlflowClient(tracking_uri)
    if resume and resume != "last":
        run = client.get_run(resume)  # a wrong id fails here, naming it
        if run.info.experiment_id != experiment_id:
            raise ValueError(
                f"tracking.resume={resume!r} is a run of another experiment "
                f"({run.info.experiment_id}): set tracking.experiment to its experiment"
            )
        return resume
    where = "attributes.status != 'FINISHED'"
    if resume == "last":
        # Failed ones only: a RUNNING run may be another driver's, training right now. One whose
        # driver was killed stays RUNNING too: a newer one is named, for the user to resume.
        failed = newest_run(client, experiment_id, "attributes.status = 'FAILED'")
        running = newest_run(client, experiment_id, "attributes.status = 'RUNNING'")
        if failed is None:
            also = (
                f"; run {running.info.run_id} is RUNNING: if its driver is gone (killed, its "
                f"machine lost), continue it with --resume {running.info.run_id}"
                if running
                else ""
            )
            raise ValueError(
                f"tracking.resume='last': experiment {experiment_id} has no failed run to "
                f"continue{also}; else run without --resume"
            )
        if running is not None and running.info.start_time > failed.info.start_time:
            logger.warning(
                "tracking.resume='last' continues failed run %s; newer run %s is RUNNING and "
                "is left alone (another driver may be training it; if its driver is gone, "
                "continue it with --resume %s)",
                failed.info.run_id,
                running.info.run_id,
                running.info.run_id,
            )
        return failed.info.run_id
    if flow_run_id:
        run = newest_run(
            client, experiment_id, f"{where} and tags.`{FLOW_RUN_TAG}` = '{flow_run_id}'"
        )
        return run.info.run_id if run else None
    return None


def newest_run(client, experiment_id: str, where: str):
    """The newest run of the experiment that ``where`` (an MLflow search filter) finds, or None."""
    runs = client.search_runs(
        [experiment_id], where, order_by=["attributes.start_time DESC"], max_results=1
    )
    return runs[0] if runs else None


def check_same_params(tracking_uri: str, run_id: str, params: dict) -> None:
    """A resumed run trains what it trained before: differing parameters are an error."""
    logged = MlflowClient(tracking_uri).get_run(run_id).data.params
    differ = {
        k: (logged[k], str(v)) for k, v in params.items() if k in logged and logged[k] != str(v)
    }
    if differ:
        shown = ", ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in differ.items())
        raise ValueError(
            f"run {run_id} cannot be resumed with other parameters ({shown}): resume with the "
            "same ones, or start a new run"
        )


def backfill_epoch_metrics(tracking_uri: str, run_id: str, history: dict[str, list[float]]) -> int:
    """Log the epochs of ``history`` the run lacks; the number of points logged. Idempotent."""
    client = MlflowClient(tracking_uri)
    now = int(time.time() * 1000)
    missing = []
    for key, values in history.items():
        logged = {m.step for m in client.get_metric_history(run_id, key)}
        missing += [
            Metric(key, v, now, step) for step, v in enumerate(values) if step not in logged
        ]
    for i in range(0, len(missing), 1000):  # MLflow's limit per batch
        client.log_batch(run_id, metrics=missing[i : i + 1000])
    if missing:
        logger.warning(
            "logged %d epoch metric point(s) the training could not send to MLflow itself",
            len(missing),
        )
    return len(missing)
