"""The flows' parameters, importable without Prefect or Spark.

The command line checks a run's parameters with these before it starts a service or imports
Prefect (whose settings, such as PREFECT_API_URL, are read once at import).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bench.conditions import parse_condition
from tasks.config import (
    GRAPH_MODELS,
    DataParams,
    LauncherParams,
    TrackingParams,
    TrainingParams,
)
from tasks.train import TrainConfig


class PipelineParams(BaseModel):
    """Everything one pipeline run needs; the defaults train on the bundled digits."""

    # Errors never repeat an input as given (a weights URL or extra_env may hold a secret).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    data: DataParams = DataParams()
    training: TrainingParams = TrainingParams()
    launcher: LauncherParams = LauncherParams()
    tracking: TrackingParams = TrackingParams()

    @model_validator(mode="after")
    def _image_model(self) -> PipelineParams:
        if self.training.model in GRAPH_MODELS:
            raise ValueError(
                f"training.model {self.training.model!r} trains on graphs: the pipeline trains "
                "image models; run it with `hvdflow bench --model gcn`"
            )
        return self

    def train_config(self) -> TrainConfig:
        return TrainConfig(training=self.training, launcher=self.launcher, tracking=self.tracking)


class BenchParams(BaseModel):
    """The study: one model and dataset, conditions x repetitions x epochs.

    ``launcher`` gives the Spark master and Horovod's knobs; the conditions give np.
    """

    # Errors never repeat an input as given (a weights URL or extra_env may hold a secret).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    data: DataParams = DataParams(image_size=(28, 28))
    training: TrainingParams = TrainingParams(
        model="mnist_cnn",
        batch_size=64,
        # Adadelta at its customary rate, as in the Databricks MNIST example.
        learning_rate=1.0,
        optimizer="adadelta",
        # '' trains from scratch; a source is staged once and loaded by every rank.
        weights_source="",
    )
    launcher: LauncherParams = LauncherParams()
    conditions: list[str] = ["keras", "1", "2"]
    repetitions: int = Field(default=3, ge=1)
    experiment: str = Field(default="hvdflow-benchmark", min_length=1)

    @field_validator("conditions")
    @classmethod
    def _valid_conditions(cls, conditions: list[str]) -> list[str]:
        if not conditions:
            raise ValueError("conditions is empty: expected e.g. ['keras', '1', '2']")
        for condition in conditions:
            parse_condition(condition)
        return conditions

    @model_validator(mode="after")
    def _np_from_conditions(self) -> BenchParams:
        if "np" in self.launcher.model_fields_set:
            raise ValueError(
                f"launcher.np={self.launcher.np}: the benchmark takes np from conditions (e.g. "
                "['keras', '1', '2']); leave launcher.np unset"
            )
        return self
