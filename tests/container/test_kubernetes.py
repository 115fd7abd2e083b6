"""docs/kubernetes.md's manifests hold against Kubernetes' own schemas (kubernetes-validate,
offline, strict: no field Kubernetes does not know): Spark's executor pod template, and the Job
of the Prefect work pool's base job template with its placeholders filled in as the worker fills
them. No cluster runs them here; a misspelt field or a wrong type fails this test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

pytestmark = pytest.mark.unit

MANIFESTS = Path(__file__).resolve().parents[2] / "container" / "kubernetes"
VERSION = "1.37.0"


def filled(template, values: dict):
    """The template with each ``"{{ name }}"`` replaced as Prefect's worker does: a whole-string
    placeholder by the value itself (any type), one inside a string by its text."""
    if isinstance(template, dict):
        return {key: filled(value, values) for key, value in template.items()}
    if isinstance(template, list):
        return [filled(value, values) for value in template]
    if isinstance(template, str):
        whole = re.fullmatch(r"\{\{\s*(\w+)\s*\}\}", template)
        if whole:
            return values[whole.group(1)]
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(values[m.group(1)]), template)
    return template


def job_of(template: dict) -> dict:
    """The Job a worker would submit, from the template's defaults and a flow run's values."""
    properties = template["variables"]["properties"]
    values = {name: spec.get("default") for name, spec in properties.items()}
    values |= {
        "name": "hvdflow-pipeline-run",
        "command": ["python", "-m", "prefect.engine"],
        "labels": {"prefect.io/flow-run-id": "0b0c"},
        "env": [{"name": "MLFLOW_TRACKING_URI", "value": "https://mlflow.example.com"}],
    }
    return filled(template["job_configuration"]["job_manifest"], values)


def test_sparks_executor_pod_template_is_a_valid_pod_asking_for_a_gpu():
    pod = yaml.safe_load((MANIFESTS / "spark-executor.yaml").read_text())
    kubernetes_validate.validate(pod, VERSION, strict=True)
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "PYSPARK_PYTHON", "value": "/opt/hvdflow/bin/python"} in container["env"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_prefect_work_pools_job_is_valid_and_takes_credentials_by_reference():
    template = json.loads((MANIFESTS / "prefect-base-job-template.json").read_text())
    job = job_of(template)
    kubernetes_validate.validate(job, VERSION, strict=True)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "hvdflow:classic"
    assert container["envFrom"] == [{"secretRef": {"name": "hvdflow-credentials"}}]
    # Every variable the template declares is used, and every placeholder is declared.
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", json.dumps(template["job_configuration"])))
    assert used == set(template["variables"]["properties"])


def test_a_wrong_field_fails_the_check():
    pod = yaml.safe_load((MANIFESTS / "spark-executor.yaml").read_text())
    pod["spec"]["containers"][0]["resource"] = pod["spec"]["containers"][0].pop("resources")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, VERSION, strict=True)
