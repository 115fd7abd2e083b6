"""The training step's parameters, importable without MLflow, Spark or TensorFlow: the command
line and the flows check a run's parameters with it before anything heavy is imported."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from hvdflow.tasks.config import LauncherParams, TrackingParams, TrainingParams


class TrainConfig(BaseModel):
    """The training step's share of a flow's parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    training: TrainingParams = TrainingParams()
    launcher: LauncherParams = LauncherParams()
    tracking: TrackingParams = TrackingParams()
