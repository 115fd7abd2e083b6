"""What a registered model version says about itself on the MLflow model page, and the steady-state
throughput figure the run reports beside its wall clock.

The model version page shows the aliases (``candidate``, ``champion``) by itself; its description
says what produced the version: the dataset's fingerprint, the number of ranks, the engine, the
Prefect flow run (a link) and the MLflow run, so that whoever finds ``champion`` there can trace it
back without opening anything else. The text is built by a pure function (``version_card``);
``describe_version`` writes it with MlflowClient.update_model_version.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hvdflow.infra.constants import HOROVOD
from hvdflow.infra.secrets import redact_url

logger = logging.getLogger(__name__)

# The MLflow metric of steady-state training throughput (images/s), beside the wall-clock
# ``images_per_s`` that includes launching the ranks and the first epoch's warm-up.
STEADY_METRIC = "steady_images_per_s"
DEFAULT_ENGINE = HOROVOD


def steady_images_per_s(images_per_epoch: float, epoch_times: Sequence[float]) -> float | None:
    """Images per second over the epochs after the first, whose time also holds the warm-up
    (graph tracing, the first reads, Horovod's first negotiations); with one epoch, that one.
    None when no epoch time is known (or none is positive)."""
    times = [float(t) for t in epoch_times]
    steady = times[1:] or times[:1]
    if not steady or sum(steady) <= 0:
        return None
    return images_per_epoch / (sum(steady) / len(steady))


def flow_run_url(flow_run_id: str | None) -> str | None:
    """The Prefect UI page of ``flow_run_id``: under ``PREFECT_UI_URL``, which Prefect derives
    from ``PREFECT_API_URL`` when unset; None for no flow run or a UI-less (ephemeral) API."""
    if not flow_run_id:
        return None
    from prefect.utilities.urls import url_for

    url = url_for("flow-run", obj_id=str(flow_run_id))
    return redact_url(url) if url else None


def version_card(
    *,
    dataset_fingerprint: str,
    np: int,
    engine: str = DEFAULT_ENGINE,
    flow_run_url: str | None = None,
    flow_run_id: str | None = None,
    run_id: str | None = None,
    steady_images_per_s: float | None = None,
    val_accuracy: float | None = None,
) -> str:
    """The version's description (Markdown, which MLflow's model page renders)."""
    count = f"{abs(np)} rank{'s' if abs(np) != 1 else ''}"
    ranks = f"{count} on the Spark cluster" if np > 0 else f"{count} on the driver"
    lines = [
        "Trained by the hvdflow pipeline.",
        "",
        f"- dataset fingerprint: `{dataset_fingerprint}`",
        f"- np: {np} ({ranks})",
        f"- engine: {engine}",
    ]
    if flow_run_url:
        lines.append(f"- Prefect flow run: [{flow_run_id or flow_run_url}]({flow_run_url})")
    elif flow_run_id:
        lines.append(f"- Prefect flow run: `{flow_run_id}`")
    if run_id:
        lines.append(f"- MLflow run: `{run_id}`")
    if val_accuracy is not None:
        lines.append(f"- val_accuracy (last epoch): {val_accuracy:.4f}")
    if steady_images_per_s is not None:
        lines.append(f"- training throughput (steady state): {steady_images_per_s:.1f} images/s")
    return "\n".join(lines)


def describe_version(
    name: str,
    version: str | None,
    *,
    dataset_fingerprint: str,
    np: int,
    engine: str = DEFAULT_ENGINE,
    flow_run_url: str | None = None,
    client=None,
    **more,
) -> str | None:
    """Write ``version_card(...)`` as the description of ``version`` of registered model
    ``name``; return it (None when there is no version). ``more``: the optional fields of
    ``version_card``. ``client``: an MlflowClient (default: one for the current tracking URI).

    The description is for people: a tracking server that refuses it is logged as a warning and
    never fails a finished training.
    """
    if version is None:
        return None
    text = version_card(
        dataset_fingerprint=dataset_fingerprint,
        np=np,
        engine=engine,
        flow_run_url=flow_run_url,
        **more,
    )
    if client is None:
        from mlflow import MlflowClient

        client = MlflowClient()
    try:
        client.update_model_version(name, str(version), description=text)
    except Exception as e:
        logger.warning("could not describe %s version %s in MLflow: %s", name, version, e)
        return None
    return text
