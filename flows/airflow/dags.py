"""The DAG factories: the pipeline, and scoring that follows the registry's champion.

Imported in Airflow's environment, where hvdflow may lack its dependencies: nothing here imports
Spark, TensorFlow, MLflow or Prefect. Each heavy task runs in hvdflow's own environment
(``python``) through ``@task.external_python``.

    from hvdflow.airflow import pipeline_dag, scoring_dag

    pipeline_dag()                                   # dag id hvdflow_pipeline
    scoring_dag(score_input="s3://bucket/new-images/")  # runs on each new champion
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from datetime import timedelta

from airflow.sdk import Asset, Param, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from hvdflow.flows.airflow.form import DESCRIPTIONS, NESTED_FIELD, PIPELINE_FIELDS
from hvdflow.tasks.edges import EDGE_RETRIES, EDGE_RETRY_DELAYS_S

# The interpreter of hvdflow's environment, when the DAG file does not name one.
PYTHON_VARIABLE = "HVDFLOW_PYTHON"
# What scoring scores when the DAG file names nothing (a folder, or s3://bucket/prefix).
SCORE_INPUT_VARIABLE = "HVDFLOW_SCORE_INPUT"
# Where its predictions go when the DAG file names nothing (empty: HVDFLOW_HOME/scores/<model>).
SCORE_OUTPUT_VARIABLE = "HVDFLOW_SCORE_OUTPUT"
DEFAULT_MODEL = "hvdflow-classifier"  # tasks.config's registered_model_name default
CHAMPION = "champion"
# The flaky edges retry as in the Prefect flow: the tracking server and the object store.
EDGE_RETRY = {
    "retries": EDGE_RETRIES,
    "retry_delay": timedelta(seconds=EDGE_RETRY_DELAYS_S[0]),
    "retry_exponential_backoff": 2.0,
}
TRAIN_RETRY = {"retries": 1, "retry_delay": timedelta(seconds=15)}
INTEGER_FIELDS = ("np", "epochs")

log = logging.getLogger(__name__)


def champion_asset(model_name: str = DEFAULT_MODEL) -> Asset:
    """The asset updated when ``champion`` moves on ``model_name``; its extra names the version."""
    return Asset(f"hvdflow://models/{model_name}/champion")


def hvdflow_python(python: str | None = None) -> str:
    """The interpreter of hvdflow's environment: ``python``, else ``$HVDFLOW_PYTHON``, else
    this one when hvdflow's dependencies are installed beside Airflow."""
    found = python or os.environ.get(PYTHON_VARIABLE)
    if found:
        return found
    if importlib.util.find_spec("pyspark") and importlib.util.find_spec("mlflow"):
        return sys.executable
    raise RuntimeError(
        f"no Python of hvdflow's environment: set {PYTHON_VARIABLE} (e.g. "
        "/opt/hvdflow/.venv/bin/python) where Airflow parses its DAGs and runs its tasks, or "
        "pass python=... to the DAG factory"
    )


def ui_base_url() -> str:
    """Airflow's UI (``[api] base_url``) for the model card's links; empty when not configured."""
    try:
        from airflow.sdk.configuration import conf  # noqa: PLC0415 (not in every Airflow 3)

        return (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    except ImportError:
        return os.environ.get("AIRFLOW__API__BASE_URL", "").rstrip("/")


def _hvdflow_step(step, *args):
    # Airflow copies this function's source into a script: the import must be inside it.
    from hvdflow.flows.airflow.steps import run  # noqa: PLC0415

    return run(step, *args)


def _in_hvdflow(python: str, task_id: str, **options):
    """A task that runs one of ``steps``'s steps in hvdflow's environment."""
    return task.external_python(task_id=task_id, python=python, expect_airflow=False, **options)(
        _hvdflow_step
    )


def _form(defaults: dict) -> dict:
    """The trigger form: the command line's flags as fields (empty: the default), ``params`` for
    any other as nested JSON. Types only: the first task checks the values."""
    form = {}
    for field in PIPELINE_FIELDS:
        kind = "integer" if field in INTEGER_FIELDS else "string"
        form[field] = Param(
            defaults.get(field), type=["null", kind], description=DESCRIPTIONS[field]
        )
    form[NESTED_FIELD] = Param(
        defaults.get(NESTED_FIELD, {}), type="object", description=DESCRIPTIONS[NESTED_FIELD]
    )
    return form


def pipeline_dag(
    dag_id: str = "hvdflow_pipeline",
    *,
    python: str | None = None,
    registered_model: str = DEFAULT_MODEL,
    schedule=None,
    defaults: dict | None = None,
    **dag_options,
):
    """The pipeline: validate → check tracking → preprocess → stage weights → train →
    register, one DAG run a time (the cluster is shared in turn).

    ``defaults``: the form's values (``{"np": 2, "params": {"training": {...}}}``);
    ``registered_model``: whose champion the ``register`` task's asset follows; other keyword
    arguments go to ``@dag`` (``start_date``, ``tags``, ...)."""
    interpreter = hvdflow_python(python)
    asset = champion_asset(registered_model)
    options = {"max_active_runs": 1, "catchup": False, "tags": ["hvdflow"], **dag_options}

    @dag(dag_id=dag_id, schedule=schedule, params=_form(defaults or {}), **options)
    def pipeline():
        # A bad value fails here, at once and never retried, with the same line as `hvdflow run`.
        params = _in_hvdflow(interpreter, "validate", retries=0)(
            "validate", "{{ params | tojson }}"
        )
        tracking = _in_hvdflow(interpreter, "check_tracking", **EDGE_RETRY)("check_tracking")
        # Not retried, whatever default_task_retries: Spark retries its tasks, and a failed run
        # publishes nothing.
        dataset = _in_hvdflow(interpreter, "preprocess", retries=0)("preprocess", params)
        weights = _in_hvdflow(interpreter, "stage_weights", **EDGE_RETRY)(
            "stage_weights", params, dataset
        )
        base = ui_base_url()
        this_run = {
            "dag_id": dag_id,
            "run_id": "{{ run_id }}",
            "url": f"{base}/dags/{dag_id}/runs/" + "{{ run_id | urlencode }}" if base else "",
        }
        # The launcher retries a rank's failure; this retry is for the launcher's own process
        # killed with its worker. The retry continues the DAG run's MLflow run from its last
        # checkpoint, waits for a first one still training (tasks.train.lease), or answers with
        # what it recorded (tasks.train.once): one model.
        trained = _in_hvdflow(interpreter, "train", **TRAIN_RETRY)(
            "train", params, dataset, weights, this_run
        )
        params >> tracking >> dataset
        register.override(outlets=[asset])(trained, registered_model)

    return pipeline()


@task(task_id="register")
def register(trained: dict, registered_model: str, *, outlet_events=None) -> dict:
    """What the registry holds after training. When the new version became ``champion``, the
    asset's event names it for the scoring DAGs; otherwise this task is skipped, saying why."""
    asset = champion_asset(registered_model)
    version, aliases = trained.get("model_version"), trained.get("aliases") or []
    name = trained.get("registered_model")
    # TrainResult.champion_moved decides; an older hvdflow in the tasks' environment omits it.
    moved = trained.get("champion_moved", bool(version) and CHAMPION in aliases)
    if not moved:
        held = ", ".join(aliases) or "no alias"
        raise AirflowSkipException(
            f"{name} version {version} holds {held}: {CHAMPION} did not move, nothing to score"
        )
    if name != registered_model:
        raise AirflowSkipException(
            f"the run registered {name}, not {registered_model} (tracking.registered_model_name): "
            f"the asset {asset.uri} follows {registered_model}"
        )
    outlet_events[asset].extra = {
        "model": name,
        "version": str(version),
        "model_uri": trained.get("model"),
        "mlflow_run_id": trained.get("mlflow_run_id"),
    }
    log.info("%s: %s version %s is %s", asset.uri, name, version, CHAMPION)
    return trained


def scoring_dag(
    dag_id: str = "hvdflow_score",
    *,
    python: str | None = None,
    registered_model: str = DEFAULT_MODEL,
    score_input: str | None = None,
    score_output: str | None = None,
    input_format: str = "images",
    **dag_options,
):
    """Scoring that follows the registry: runs when the pipeline moves ``champion`` on
    ``registered_model`` and scores ``score_input`` (default ``$HVDFLOW_SCORE_INPUT``) with the
    version the asset event names, into ``score_output`` (default ``$HVDFLOW_SCORE_OUTPUT``, else
    HVDFLOW_HOME/scores/<model>: on a cluster, give a bucket or a shared folder). A run
    triggered by hand scores with the version in its ``version`` field, else with whatever holds
    ``champion`` then."""
    interpreter = hvdflow_python(python)
    asset = champion_asset(registered_model)
    options = {"max_active_runs": 1, "catchup": False, "tags": ["hvdflow"], **dag_options}
    form = {
        "input": Param(
            score_input or os.environ.get(SCORE_INPUT_VARIABLE, ""),
            type="string",
            description="the images to score: a folder every executor sees, or s3://bucket/prefix",
        ),
        "output": Param(
            score_output or os.environ.get(SCORE_OUTPUT_VARIABLE, ""),
            type="string",
            description="where the predictions go: s3://bucket/prefix, or a folder the executors "
            "and the driver share (empty: HVDFLOW_HOME/scores/<model>)",
        ),
        "input_format": Param(input_format, type="string", description="images or dataset"),
        "version": Param(
            None,
            type=["null", "string"],
            description="a run by hand: the version to score with (empty: the champion)",
        ),
    }

    @dag(dag_id=dag_id, schedule=[asset], params=form, **options)
    def scoring():
        version = champion_version()
        score_params = {
            "model": {"name": registered_model},
            "data": {
                "input": "{{ params.input }}",
                "input_format": "{{ params.input_format }}",
                "output": "{{ params.output }}",
            },
        }
        _in_hvdflow(interpreter, "score")(
            "score", score_params, version, f"{dag_id}/" + "{{ run_id }}"
        )

    return scoring()


@task(task_id="champion_version")
def champion_version(*, triggering_asset_events=None, params=None) -> str:
    """The version to score with: the newest asset event's (a run the pipeline started), else
    the form's ``version``, else "" (whatever holds ``champion`` when scoring starts)."""
    events = [e for found in (triggering_asset_events or {}).values() for e in found]
    if events:
        version = str(events[-1].extra["version"])
        log.info("scoring with version %s, the champion the asset event named", version)
        return version
    return str((params or {}).get("version") or "")
