"""The event that tells registry consumers a new version is ``champion``.

Emitted to Prefect when the training step moves the alias, so that a deployment can follow the
registry (``hvdflow deploy --score-on-champion`` scores with each new champion). The resource is
the registered model; its labels name it and the version, for triggers to match and read.
"""

from __future__ import annotations

from prefect.events import emit_event

CHAMPION_MOVED = "hvdflow.model.champion-moved"
MODEL_NAME = "hvdflow.model.name"
MODEL_VERSION = "hvdflow.model.version"


def champion_moved(model_name: str, version: str, run_id: str):
    """Emit ``hvdflow.model.champion-moved`` for ``model_name`` version ``version``."""
    return emit_event(
        event=CHAMPION_MOVED,
        resource={
            "prefect.resource.id": f"hvdflow.model.{model_name}",
            "prefect.resource.name": model_name,
            MODEL_NAME: model_name,
            MODEL_VERSION: str(version),
        },
        payload={"mlflow_run_id": run_id, "model_uri": f"models:/{model_name}/{version}"},
    )
