"""The flows' parameters, importable without Prefect or Spark.

The command line checks a run's parameters with these before it starts a service or imports
Prefect (whose settings, such as PREFECT_API_URL, are read once at import).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hvdflow.bench.conditions import HOROVOD as HOROVOD_CONDITION
from hvdflow.bench.conditions import parse_condition
from hvdflow.bench.study import STUDY_DATA, STUDY_TRAINING
from hvdflow.infra import extras
from hvdflow.infra.home import hvdflow_home
from hvdflow.tasks.config import (
    GRAPH_MODELS,
    DataParams,
    LauncherParams,
    TrackingParams,
    TrainingParams,
)
from hvdflow.tasks.score.config import ModelRef, ScoreConfig
from hvdflow.tasks.train.config import TrainConfig
from hvdflow.training.frameworks import framework

# The benchmark's default workload: the bundled digits, augmented to an MNIST-sized set.
AUGMENTED_DIGITS = "augmented_digits"
# The study's setup (hvdflow.bench.study), under what a caller changes.
BENCH_DATA, BENCH_TRAINING = STUDY_DATA, STUDY_TRAINING


def reader_for(data: DataParams, training: TrainingParams) -> TrainingParams:
    """``training`` with a reader that can read ``data``: Petastorm's cannot read raw pixels,
    so a raw dataset gets the pyarrow reader unless one was asked for, and a request for
    Petastorm's is refused."""
    if data.image_encoding != "raw" or training.reader == "pyarrow":
        return training
    if "reader" in training.model_fields_set:
        raise ValueError(
            "training.reader='petastorm' cannot read data.image_encoding='raw' (Petastorm "
            "decodes PNG and JPEG only): use training.reader='pyarrow', or image_encoding='png'"
        )
    return training.model_copy(update={"reader": "pyarrow"})


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

    @model_validator(mode="before")
    @classmethod
    def _reader_reads_the_encoding(cls, values):
        if isinstance(values, dict) and "data" in values:
            data = DataParams.model_validate(values["data"])
            training = TrainingParams.model_validate(values.get("training") or {})
            values = {**values, "data": data, "training": reader_for(data, training)}
        return values

    def train_config(self) -> TrainConfig:
        return TrainConfig(training=self.training, launcher=self.launcher, tracking=self.tracking)


def default_conditions() -> list[str]:
    """The paper's sweep: Keras on every core and on one, the machine's ceiling, np=1 and np=2
    with Horovod where it is installed (the classic profile) and np=2 with TensorFlow's
    collectives; where Horovod is not, np=1 and np=2 with TensorFlow's collectives."""
    if extras.installed(extras.HOROVOD):
        return ["keras", "keras1", "ceiling2", "hvd1", "hvd2", "tf2"]
    return ["keras", "keras1", "ceiling2", "tf1", "tf2"]


class BenchParams(BaseModel):
    """The study: one model and dataset, conditions x repetitions x epochs.

    ``launcher`` gives the Spark master and Horovod's knobs; the conditions give np.
    """

    # Errors never repeat an input as given (a weights URL or extra_env may hold a secret).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    data: DataParams = DataParams(**BENCH_DATA)
    training: TrainingParams = TrainingParams(**BENCH_TRAINING)
    launcher: LauncherParams = LauncherParams()
    conditions: list[str] = Field(default_factory=default_conditions)
    repetitions: int = Field(default=5, ge=1)  # MLPerf Training runs 5 to 10 seeds
    threads_per_rank: int = Field(
        default=1,
        ge=1,
        description="TensorFlow threads of each rank (and each ceiling process): every engine "
        "condition gets the same budget, so that scaling compares like with like",
    )
    workload: Literal["augmented_digits", "data"] = Field(
        default=AUGMENTED_DIGITS,
        description="with no data.input: 'augmented_digits' makes an MNIST-sized set from the "
        "bundled digits (deterministic shifts, rotations, noise); 'data' uses data as given",
    )
    images: int = Field(
        default=60_000, ge=100, description="training images of the augmented_digits workload"
    )
    target_accuracy: float = Field(
        default=0.97,
        gt=0,
        le=1,
        description="the val_accuracy whose time to reach, launch included, the table reports "
        "per condition (MLPerf's time to train); chosen so that hvd1 reaches it in a few epochs "
        "on the default workload",
    )
    experiment: str = Field(default="hvdflow-benchmark", min_length=1)

    @field_validator("data", "training", mode="before")
    @classmethod
    def _on_the_bench_defaults(cls, value, info):
        """``{"training": {"epochs": 3}}`` changes the epochs of the study's setup, not of the
        pipeline's (whose model, batch and optimizer are not the paper's)."""
        if isinstance(value, dict):
            defaults = BENCH_DATA if info.field_name == "data" else BENCH_TRAINING
            if "optimizer" in value and "learning_rate" not in value:
                # Adadelta's 1.0 is no rate for another optimizer: that one's customary rate.
                defaults = {k: v for k, v in defaults.items() if k != "learning_rate"}
            return {**defaults, **value}
        return value

    @field_validator("training")
    @classmethod
    def _tensorflow_study(cls, training: TrainingParams) -> TrainingParams:
        if not framework(training.framework).study:
            raise ValueError(
                "the study's conditions train with TensorFlow: leave training.framework at "
                "'tensorflow' (in a checkout, python -m studies.torch_engine measures the "
                "PyTorch trainer)"
            )
        return training

    @field_validator("conditions")
    @classmethod
    def _valid_conditions(cls, conditions: list[str]) -> list[str]:
        if not conditions:
            raise ValueError("conditions is empty: expected e.g. ['keras', 'hvd1', 'hvd2']")
        for condition in conditions:
            if parse_condition(condition).kind == HOROVOD_CONDITION:
                extras.require(
                    extras.HOROVOD, f"condition {condition!r}", "tfN (the tf_collective engine)"
                )
        return conditions

    @model_validator(mode="after")
    def _np_from_conditions(self) -> BenchParams:
        if "np" in self.launcher.model_fields_set:
            raise ValueError(
                f"launcher.np={self.launcher.np}: the benchmark takes np from conditions (e.g. "
                "['keras', '1', '2']); leave launcher.np unset"
            )
        return self


class ScoreParams(BaseModel):
    """One scoring run: which registered model version, what to score, where predictions go.

    ``model`` defaults to ``models:/hvdflow-classifier@champion``, what the pipeline registers;
    ``data.output`` empty means ``HVDFLOW_HOME/scores/<model name>``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelRef = ModelRef()
    data: ScoreConfig
    spark_master: str | None = Field(
        default=None,
        description="a Spark master (local[N], spark://host:7077, yarn, ...) or a Spark "
        "Connect URL (sc://host:15002); default: $HVDFLOW_SPARK_MASTER, else $SPARK_REMOTE, "
        "else local[N]",
    )
    experiment: str = Field(default="hvdflow-scoring", min_length=1)

    def score_config(self) -> ScoreConfig:
        """``data`` with its output resolved (empty: under HVDFLOW_HOME)."""
        if self.data.output:
            return self.data

        output = str(hvdflow_home() / "scores" / self.model.name)
        return self.data.model_copy(update={"output": output})
