"""prefect.yaml: the deployments Prefect's own tools deploy (`prefect deploy --all`) for a worker
that shares the checkout. (`hvdflow deploy`, which needs none, is tested in tests/flows.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hvdflow.flows.params import BenchParams, PipelineParams

ROOT = Path(__file__).resolve().parent.parent


def prefect_yaml() -> dict:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())


@pytest.mark.unit
def test_prefect_yaml_deploys_both_flows_to_the_process_pool_with_valid_parameters():
    config = prefect_yaml()
    deployments = {d["name"]: d for d in config["deployments"]}
    assert set(deployments) == {"hvdflow-pipeline", "hvdflow-benchmark"}
    expected = {
        "hvdflow-pipeline": ("flows/prefect/pipeline.py:pipeline", PipelineParams, "0 3 * * *"),
        "hvdflow-benchmark": ("flows/prefect/benchmark.py:benchmark", BenchParams, "0 4 * * 0"),
    }
    for name, (entrypoint, model, cron) in expected.items():
        deployment = deployments[name]
        assert deployment["entrypoint"] == entrypoint
        path, function = entrypoint.split(":")
        assert f"def {function}(" in (ROOT / path).read_text()
        model.model_validate(deployment["parameters"]["params"])  # what a scheduled run gets
        assert [s["cron"] for s in deployment["schedules"]] == [cron]
        assert deployment["work_pool"]["name"] == "hvdflow"
        assert deployment["concurrency_limit"] == 1
    # Each run starts in the folder `prefect deploy` ran in: a build step's output, not a path
    # written into the file.
    (build,) = config["build"]
    step_id = build["prefect.deployments.steps.run_shell_script"]["id"]
    (pull,) = config["pull"]
    directory = pull["prefect.deployments.steps.set_working_directory"]["directory"]
    assert directory == f"{{{{ {step_id}.stdout }}}}"
