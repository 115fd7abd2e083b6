"""``hvdflow deploy``: the pipeline, the benchmark and scoring as deployments of a work pool.

The entrypoints are module paths (``hvdflow.flows.prefect.pipeline.pipeline``, ...), not files of a
checkout: a worker started in any folder of any machine where hvdflow is installed (a virtual
environment, a container image) runs them, with nothing pulled and nothing built. prefect.yaml
remains for a worker that shares the deploying machine's checkout.

Scoring can follow the registry: with ``score_on_champion``, its deployment carries a trigger on
the event the training step emits when ``champion`` moves (``hvdflow.model.champion-moved``), and
scores ``score_input`` with the version the event names.
"""

from __future__ import annotations

from prefect import deploy
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.deployments.runner import EntrypointType
from prefect.events import DeploymentEventTrigger
from prefect.exceptions import ObjectNotFound

from hvdflow.flows.params import PipelineParams, ScoreParams
from hvdflow.flows.prefect.benchmark import benchmark
from hvdflow.flows.prefect.events import CHAMPION_MOVED, MODEL_NAME, MODEL_VERSION
from hvdflow.flows.prefect.pipeline import pipeline
from hvdflow.flows.prefect.scoring import score

PIPELINE, BENCHMARK, SCORE = "hvdflow-pipeline", "hvdflow-benchmark", "hvdflow-score"


def champion_trigger(params: ScoreParams) -> DeploymentEventTrigger:
    """Run scoring when ``champion`` moves on ``params.model.name``, with the version moved to."""
    scoring = params.model_dump(mode="json")
    # A Jinja template the server fills from the event when the trigger fires.
    scoring["model"]["version"] = "{{ event.resource['" + MODEL_VERSION + "'] }}"
    del scoring["model"]["alias"]  # the version, not whatever holds the alias when it runs
    return DeploymentEventTrigger(
        name=f"score {params.model.name}'s new champion",
        expect={CHAMPION_MOVED},
        match={MODEL_NAME: params.model.name},
        parameters={"params": scoring},
    )


def deployments(
    pipeline_params: PipelineParams,
    *,
    cron: str | None,
    bench_cron: str | None,
    score_params: ScoreParams | None = None,
    score_cron: str | None = None,
    score_on_champion: bool = False,
    job_variables: dict | None = None,
) -> list:
    """The three deployments; scoring's default parameters exist only with ``score_params``
    (without them a run asked for in the UI names its input there). ``job_variables``: the
    pool's (a Docker pool's: ``docker_pool.job_variables``); default, a process pool's."""
    common = {
        "entrypoint_type": EntrypointType.MODULE_PATH,
        "concurrency_limit": 1,
        # Each run in the worker's own folder, where nothing is written: without a working_dir
        # Prefect's process worker makes a temporary folder per run and removes it only when
        # the run ends under it, so a worker killed mid-run left one behind per run.
        "job_variables": job_variables or {"working_dir": "."},
    }
    made = [
        pipeline.to_deployment(
            name=PIPELINE,
            cron=cron,
            parameters={"params": pipeline_params.model_dump(mode="json")},
            **common,
        ),
        benchmark.to_deployment(name=BENCHMARK, cron=bench_cron, **common),
    ]
    if score_on_champion and score_params is None:
        raise ValueError("scoring on a new champion needs what to score: give --score-input")
    made.append(
        score.to_deployment(
            name=SCORE,
            cron=score_cron,
            parameters={"params": score_params.model_dump(mode="json")} if score_params else {},
            triggers=[champion_trigger(score_params)] if score_on_champion else None,
            **common,
        )
    )
    return made


class WrongPoolType(ValueError):
    """The pool exists with a type whose workers cannot run these deployments' jobs."""


def ensure_pool(name: str, kind: str = "process") -> bool:
    """Create work pool ``name`` of type ``kind`` unless a pool of that name exists; True if
    created; WrongPoolType for a pool of another type."""
    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type=kind))
            return True
    if pool.type != kind:
        given = "--image" if kind == "docker" else "no --image"
        raise WrongPoolType(
            f"work pool {name!r} is a {pool.type} pool and {given} deploys to a {kind} pool: "
            "give another --pool (it is created), or delete this one"
        )
    return False


def deploy_all(pool: str, made: list, kind: str = "process") -> list[str]:
    """Register ``made`` with work pool ``pool`` of type ``kind`` (created if missing); the
    deployment ids."""
    ensure_pool(pool, kind)
    ids = deploy(
        *made, work_pool_name=pool, build=False, push=False, print_next_steps_message=False
    )
    return [str(i) for i in ids]
