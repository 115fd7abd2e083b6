"""The Airflow face's two halves without a running Airflow: the form and its validation in
hvdflow's environment, and the DAG factories as Airflow's environment parses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.airflow_harness import AIRFLOW_VENV, require_airflow


@pytest.mark.unit
def test_the_forms_fields_set_the_parameters_the_command_lines_flags_set():
    from hvdflow.flows.airflow.form import PIPELINE_FIELDS, nested_values
    from hvdflow.flows.cli import PIPELINE_FLAGS

    for field, dotted in PIPELINE_FIELDS.items():
        assert PIPELINE_FLAGS[field] == dotted, field
    conf = {"np": -2, "epochs": None, "model": "", "params": {"training": {"epochs": 4}}}
    assert nested_values(conf) == {"launcher": {"np": -2}, "training": {"epochs": 4}}
    # A field wins over the same parameter in params, as a flag wins over --params.
    assert nested_values({"epochs": 2, "params": {"training": {"epochs": 4}}}) == {
        "training": {"epochs": 2}
    }


@pytest.mark.unit
def test_a_bad_value_fails_with_the_line_of_the_prefect_flows_parameters(capsys):
    from pydantic import ValidationError

    from hvdflow.flows.airflow import steps
    from hvdflow.flows.cli_support import InvalidParameters, describe_validation_error
    from hvdflow.flows.params import PipelineParams

    conf = {"np": 2, "params": {"training": {"optimizer": "adamw2"}}}
    with pytest.raises(ValidationError) as prefect_says:
        PipelineParams.model_validate({"launcher": {"np": 2}, "training": {"optimizer": "adamw2"}})
    with pytest.raises(InvalidParameters) as airflow_says:
        steps.run("validate", json.dumps(conf))
    assert str(airflow_says.value) == describe_validation_error(PipelineParams, prefect_says.value)
    assert str(airflow_says.value).startswith("invalid parameter training.optimizer='adamw2'")
    # The last line of the task's log says it too.
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"hvdflow validate failed: {airflow_says.value}"

    with pytest.raises(InvalidParameters, match="params must be a JSON object, not 'x'"):
        steps.validate({"params": "x"})


@pytest.mark.unit
def test_validated_parameters_are_the_whole_set_as_json():
    from hvdflow.flows.airflow import steps
    from hvdflow.flows.params import PipelineParams

    params = steps.validate('{"np": -1, "epochs": 2, "params": {"training": {"seed": 3}}}')
    json.dumps(params)  # the XCom carries them as JSON
    again = PipelineParams.model_validate(params)
    assert (again.launcher.np, again.training.epochs, again.training.seed) == (-1, 2, 3)


# What the probe prints from Airflow's environment: the DAGs of the example file, their tasks,
# retries and form, and what `register` says when champion did not move.
PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.exceptions import AirflowSkipException
from hvdflow.airflow import example_dag_file
from hvdflow.flows.airflow import dags

with open(sys.argv[1], "w") as f:
    f.write(example_dag_file())
bag = DagBag(dag_folder=sys.argv[1])
pipeline = dags.pipeline_dag("probe_pipeline")
scoring = dags.scoring_dag("probe_score", score_input="/data/new", score_output="s3://b/scores")
out = {
    "example_dags": sorted(bag.dags),
    "import_errors": {k: str(v)[-500:] for k, v in bag.import_errors.items()},
    "pipeline_tasks": [t.task_id for t in pipeline.topological_sort()],
    "retries": {t.task_id: t.retries for t in pipeline.tasks},
    "form": sorted(pipeline.params.keys()),
    "max_active_runs": pipeline.max_active_runs,
    "score_input": scoring.params["input"],
    "score_output": scoring.params["output"],
    "outlets": [o.uri for o in pipeline.get_task("register").outlets],
}
try:
    dags.register.function(
        {"registered_model": "m", "model_version": "4", "aliases": ["candidate"]}, "m",
        outlet_events={},
    )
except AirflowSkipException as e:
    out["not_champion"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.unit
def test_the_train_tasks_log_has_each_rank_line_once(capsys):
    """The step prints every rank line; the rank logger's copy of the same lines stays out of
    the task's log (it doubled every log_to_driver line, epochs included)."""
    import logging

    from hvdflow.flows.airflow import steps
    from hvdflow.infra.launcher import _wire
    from hvdflow.infra.launcher._driver import RunLog

    root = logging.getLogger()
    before = list(root.handlers), root.level
    try:
        # One installed by an earlier step in this process writes to the stdout of its time.
        root.handlers[:] = [h for h in root.handlers if not getattr(h, "_hvdflow_airflow", 0)]
        steps._log_to_stdout()
        with RunLog(os.devnull, "all", steps._print_line) as run_log:
            run_log(_wire.LogLine(time=0.0, rank=0, stream=_wire.CALLBACK, text="Epoch 1/2"))
        logging.getLogger("hvdflow.tasks").info("a record of hvdflow's own")
    finally:
        root.handlers[:], _ = before[0], root.setLevel(before[1])
    lines = capsys.readouterr().out.splitlines()
    assert [ln for ln in lines if "Epoch 1/2" in ln] == ["[1,0]<log>:Epoch 1/2"], lines
    assert "INFO hvdflow.tasks: a record of hvdflow's own" in lines


@pytest.mark.integration
def test_the_example_dag_file_parses_in_airflows_environment_without_hvdflows_dependencies(
    tmp_path,
):
    require_airflow()
    python = str(AIRFLOW_VENV / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"AIRFLOW_HOME": str(tmp_path), "HVDFLOW_PYTHON": sys.executable})
    # An Airflow whose tasks retry by default: the pipeline's own retries still hold.
    env["AIRFLOW__CORE__DEFAULT_TASK_RETRIES"] = "2"
    # Airflow's environment has none of hvdflow's dependencies: no Spark, MLflow or Prefect.
    missing = subprocess.run(
        [python, "-c", "import pyspark"], env=env, cwd=tmp_path, capture_output=True
    )
    assert missing.returncode != 0
    done = subprocess.run(
        [python, "-c", PROBE, str(tmp_path / "hvdflow_dags.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["import_errors"] == {}
    assert out["example_dags"] == ["hvdflow_pipeline", "hvdflow_score"]
    assert out["pipeline_tasks"] == [
        "validate",
        "check_tracking",
        "preprocess",
        "stage_weights",
        "train",
        "register",
    ]
    # Retries on the flaky edges only, as in the Prefect flow; a bad value is never retried.
    assert out["retries"] == {
        "validate": 0,
        "check_tracking": 3,
        "preprocess": 0,
        "stage_weights": 3,
        "train": 1,  # for its process killed with its scheduler or executor worker
        "register": 2,  # Airflow's default: it only reads XCom and writes the asset event
    }
    assert out["form"] == sorted(
        ["np", "epochs", "model", "framework", "input", "input_format", "spark_master", "params"]
    )
    assert out["max_active_runs"] == 1
    assert out["outlets"] == ["hvdflow://models/hvdflow-classifier/champion"]
    assert out["score_input"] == "/data/new"
    assert out["score_output"] == "s3://b/scores"
    assert out["not_champion"] == (
        "m version 4 holds candidate: champion did not move, nothing to score"
    )

    # Without hvdflow's Python, the DAG file says what to set.
    del env["HVDFLOW_PYTHON"]
    refused = subprocess.run(
        [python, "-c", "from hvdflow.airflow import pipeline_dag; pipeline_dag()"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0
    assert "set HVDFLOW_PYTHON" in refused.stderr.strip().splitlines()[-1]
