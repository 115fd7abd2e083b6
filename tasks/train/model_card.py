"""What a registered model version says about itself on the MLflow model page, and the
steady-state throughput figure the run reports beside its wall clock.

The description says what produced the version (dataset fingerprint, ranks, engine, the
orchestrator's run, the MLflow run), so whoever finds ``champion`` can trace it back; the same
facts are its tags, for programs (``search_model_versions("tags.`hvdflow.np` = '2'")``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hvdflow.infra.constants import HOROVOD
from hvdflow.infra.secrets import redact_url
from hvdflow.tasks.train.origin import RunOrigin

logger = logging.getLogger(__name__)

# Images/s after the first epoch, beside ``images_per_s`` (launch and warm-up included).
STEADY_METRIC = "steady_images_per_s"
DEFAULT_ENGINE = HOROVOD


def steady_images_per_s(images_per_epoch: float, epoch_times: Sequence[float]) -> float | None:
    """Images per second over the epochs after the first (which holds the warm-up); with one
    epoch, that one; None without a positive epoch time."""
    times = [float(t) for t in epoch_times]
    steady = times[1:] or times[:1]
    if not steady or sum(steady) <= 0:
        return None
    return images_per_epoch / (sum(steady) / len(steady))


def version_card(
    *,
    dataset_fingerprint: str,
    np: int,
    engine: str = DEFAULT_ENGINE,
    origin: RunOrigin | None = None,
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
    if origin is not None and origin.url:
        lines.append(f"- {origin.kind}: [{origin.run_id}]({origin.url})")
    elif origin is not None:
        lines.append(f"- {origin.kind}: `{origin.run_id}`")
    if run_id:
        lines.append(f"- MLflow run: `{run_id}`")
    if val_accuracy is not None:
        lines.append(f"- val_accuracy (last epoch): {val_accuracy:.4f}")
    if steady_images_per_s is not None:
        lines.append(f"- training throughput (steady state): {steady_images_per_s:.1f} images/s")
    return "\n".join(lines)


# The version tags' prefix: hvdflow.dataset_fingerprint, hvdflow.np, ...
TAG_PREFIX = "hvdflow."
# The evaluation's figures a version carries as tags: hvdflow.evaluation.<name>.
EVALUATION_TAGGED = ("accuracy_score", "f1_score", "precision_score", "recall_score")


def version_tags(
    *,
    dataset_fingerprint: str,
    np: int,
    engine: str = DEFAULT_ENGINE,
    dataset: str | None = None,
    origin: RunOrigin | None = None,
    run_id: str | None = None,
    val_accuracy: float | None = None,
    code_version: str | None = None,
    evaluation: dict | None = None,
    **_,
) -> dict[str, str]:
    """The version's searchable lineage (MLflow tags are strings): what the card says, and the
    headline figures of its ``mlflow.models.evaluate`` (``hvdflow.training.evaluation``)."""
    values = {
        "dataset_fingerprint": dataset_fingerprint,
        "dataset": redact_url(dataset) if dataset else None,
        "np": str(np),
        "engine": engine,
        "flow_run_id": origin.run_id if origin else None,
        "orchestrator": origin.orchestrator if origin else None,
        "run_id": run_id,
        "val_accuracy": f"{val_accuracy:.6f}" if val_accuracy is not None else None,
        "code_version": code_version,
    }
    evaluated = evaluation or {}
    for name in EVALUATION_TAGGED:
        value = evaluated.get("metrics", {}).get(name)
        values[f"evaluation.{name}"] = f"{value:.6f}" if value is not None else None
    values["evaluation.confusion_matrix"] = evaluated.get("artifacts", {}).get("confusion_matrix")
    return {TAG_PREFIX + key: str(value) for key, value in values.items() if value is not None}


def describe_version(
    name: str,
    version: str | None,
    *,
    dataset_fingerprint: str,
    np: int,
    engine: str = DEFAULT_ENGINE,
    client=None,
    **more,
) -> str | None:
    """Write ``version_card(...)`` as the description of ``version`` of model ``name`` and
    ``version_tags(...)`` as its tags; return the description (None without a version).
    ``more``: the optional fields of both; ``client``: an MlflowClient (default: the current
    tracking URI's). A tracking server that refuses them is a warning, never a failure.
    """
    if version is None:
        return None
    card_fields = ("origin", "run_id", "steady_images_per_s", "val_accuracy")
    text = version_card(
        dataset_fingerprint=dataset_fingerprint,
        np=np,
        engine=engine,
        **{key: value for key, value in more.items() if key in card_fields},
    )
    tags = version_tags(dataset_fingerprint=dataset_fingerprint, np=np, engine=engine, **more)
    if client is None:
        from mlflow import MlflowClient

        client = MlflowClient()
    try:
        client.update_model_version(name, str(version), description=text)
        for key, value in tags.items():
            client.set_model_version_tag(name, str(version), key, value)
    except Exception as e:
        logger.warning("could not describe %s version %s in MLflow: %s", name, version, e)
        return None
    return text
