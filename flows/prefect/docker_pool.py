"""What the deployments of a Prefect Docker work pool carry (``hvdflow deploy --image``): the
image every flow run's container starts from, its network, and the variables that point it at
the services, the secret ones by reference.

Prefect's ``docker`` worker (prefect-docker, ``hvdflow[docker]``) starts a container of the image
per flow run and sets PREFECT_API_URL itself; the rest comes from the job variables here. A
variable whose name says it holds a secret (AWS_SECRET_ACCESS_KEY, MLFLOW_TRACKING_PASSWORD, ...)
is saved as a Prefect Secret block, and the deployment holds a reference to it
(``{{ prefect.blocks.secret.NAME }}``), which the worker resolves as it starts the container:
the value is in no deployment, flow run or log.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from hvdflow.infra.secrets import SECRET_NAME_PATTERN

DOCKER = "docker"
CONTAINER_HOSTNAME = "hvdflow-flow-run"
# The services' variables a container needs (hvdflow up's, or a team's). PREFECT_API_URL the
# worker sets; HVDFLOW_SPARK_MASTER and the rest come with --env.
SERVICE_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_S3_ENDPOINT_URL",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
)
_SECRET_NAME = re.compile(SECRET_NAME_PATTERN)
_LOOPBACK = ("localhost", "127.0.0.1", "::1")
INSTALL_ENGINE = (
    "start one (Debian: apt-get install docker.io, then dockerd; from a checkout: bash "
    "scripts/setup.sh docker) or set DOCKER_HOST to the engine the workers use"
)


class DockerPoolError(ValueError):
    """What the Docker pool's deployments would carry cannot work: the message says why."""


def secret_block_name(variable: str) -> str:
    """The Prefect Secret block that holds ``variable``'s value: AWS_SECRET_ACCESS_KEY ->
    hvdflow-aws-secret-access-key."""
    return "hvdflow-" + variable.lower().replace("_", "-")


def container_env(env: Mapping[str, str], network: str | None) -> dict[str, str]:
    """The containers' variables, from ``env`` (the deploying process's services and --env):
    secrets as references to Secret blocks, which this saves. A service on this machine's
    loopback is refused unless the containers share the host's network."""
    from prefect.blocks.system import Secret  # noqa: PLC0415 (lazy: it loads Prefect's client)

    for name, value in env.items():
        host = urlsplit(value).hostname if "://" in value else None
        if host in _LOOPBACK and network != "host":
            raise DockerPoolError(
                f"{name}={value} is this machine's loopback, which a container on "
                f"{f'network {network!r}' if network else 'the default network'} does not "
                f"reach: set {name} to an address the containers reach (hvdflow up --bind "
                "ADDRESS), or give --network host"
            )
    out = {}
    for name, value in env.items():
        if _SECRET_NAME.search(name):
            block = secret_block_name(name)
            Secret(value=value).save(block, overwrite=True, _sync=True)
            value = "{{ prefect.blocks.secret." + block + " }}"
        out[name] = value
    return out


def job_variables(image: str, network: str | None, env: Mapping[str, str]) -> dict:
    """The Docker worker's job variables for each deployment (prefect-docker's
    DockerWorkerJobConfiguration): containers removed when their run ends."""
    variables = {"image": image, "env": container_env(env, network), "auto_remove": True}
    if network == "host":
        variables["network_mode"] = "host"
        # On the host's network Prefect's worker writes the container a hosts file of its own
        # (for host.docker.internal) without the host's name, and Java, which resolves its host
        # name as Spark starts, fails: each container gets a name of its own that resolves.
        variables["container_create_kwargs"] = {
            "hostname": CONTAINER_HOSTNAME,
            "extra_hosts": {CONTAINER_HOSTNAME: "127.0.0.1"},
        }
    elif network:
        variables["networks"] = [network]
    return variables


def service_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's service variables (set by ``hvdflow up`` or the user), then ``extra``."""
    return {k: os.environ[k] for k in SERVICE_VARIABLES if os.environ.get(k)} | dict(extra)


def check_image(image: str) -> None:
    """DockerPoolError unless a Docker engine answers and has ``image``, or reaches a registry
    that serves it."""
    import docker  # noqa: PLC0415 (lazy: only a Docker pool needs it)

    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except docker.errors.DockerException as e:
        reason = str(e).split(": ")[-1].strip("()'\"")
        raise DockerPoolError(
            f"--image {image}: no Docker engine answers at {where} ({reason}): {INSTALL_ENGINE}"
        ) from None
    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.get_registry_data(image)
    except docker.errors.APIError:
        raise DockerPoolError(
            f"--image {image}: no such image on the Docker engine at {where}, nor in a "
            "registry it reaches: build it (make image PROFILE=classic), or push it to a "
            "registry the workers pull from"
        ) from None
