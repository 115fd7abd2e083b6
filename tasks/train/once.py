"""One training per orchestrator run: a run whose training already finished does not train again.

An orchestrator may run a run's training step again after it finished (its worker died while
hvdflow's process went on, a task cleared from the UI, a retry after registering); each would
register a second version. So the step first looks for a FINISHED MLflow run of the same origin
and answers with what it recorded.
"""

from __future__ import annotations

import logging

from hvdflow.tasks.train.resume import newest_run
from hvdflow.tasks.train.tags import ATTEMPTS_TAG, FLOW_RUN_TAG

logger = logging.getLogger(__name__)

EPOCH_TIME = "epoch_time_s"  # logged by rank 0 once per epoch: the run's epoch count


def finished_run(client, experiment_id: str, origin_run_id: str):
    """The newest FINISHED MLflow run of the orchestrator's run ``origin_run_id``, or None."""
    where = f"attributes.status = 'FINISHED' and tags.`{FLOW_RUN_TAG}` = '{origin_run_id}'"
    return newest_run(client, experiment_id, where)


def recorded_result(client, run, model_name: str | None) -> dict:
    """What a finished run recorded, as the fields of ``TrainResult`` (but the tracking URI)."""
    run_id = run.info.run_id
    version = None
    if model_name:
        found = client.search_model_versions(f"run_id = '{run_id}'")
        versions = sorted((int(v.version) for v in found if v.name == model_name), reverse=True)
        version = str(versions[0]) if versions else None
    aliases = list(client.get_model_version(model_name, version).aliases) if version else []

    def values(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(run_id, key), key=_step)]

    epochs = len(values(EPOCH_TIME))
    history = {}
    for key in run.data.metrics:
        points = client.get_metric_history(run_id, key)
        if epochs and sorted(m.step for m in points) == list(range(epochs)):
            history[key] = [m.value for m in sorted(points, key=_step)]
    metrics = run.data.metrics
    return {
        "run_id": run_id,
        "experiment_id": run.info.experiment_id,
        "model_version": version,
        "aliases": sorted(aliases),
        "wall_clock_s": metrics.get("wall_clock_s", 0.0),
        "images_per_s": metrics.get("images_per_s", 0.0),
        "epoch_times": history.get(EPOCH_TIME, []),
        "epoch_times_log": values("epoch_time_log_s"),
        "history": history,
        "attempts": int(run.data.tags.get(ATTEMPTS_TAG, "1")),
    }


def _step(metric) -> int:
    return metric.step
