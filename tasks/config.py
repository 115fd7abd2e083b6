"""The flows' parameters, one shape for the pipeline and the benchmark, checked before any work.

Each flow takes nested, frozen models: ``data``, ``training``, ``launcher`` and ``tracking``.
Every value is checked at the flow's entry: a bad value fails in milliseconds with its name, the
value and what would be accepted, not after preprocessing, inside the ranks, or three retries on.
"""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hvdflow.infra import constants as c
from hvdflow.infra import executor_python, extras
from hvdflow.infra.connect import default_master, is_connect, is_connect_url
from hvdflow.infra.launcher.options import HorovodOptions, launch_settings
from hvdflow.infra.secrets import (
    BY_REFERENCE,
    ENV_PREFIX,
    SECRET_URL_PATTERN,
    check_reference,
    is_reference,
    literal_secret,
    resolve,
)

# Preprocessing's own; the flows find every parameter group here.
from hvdflow.tasks.preprocess.config import DataParams, InputFormat
from hvdflow.tasks.weights.source import OFFLINE_SOURCE, redact
from hvdflow.training.frameworks import DEFAULT as DEFAULT_FRAMEWORK
from hvdflow.training.frameworks import framework
from hvdflow.training.models import Recipe, model_names, recipe
from hvdflow.training.optimizers import DEFAULT_LEARNING_RATES, OPTIMIZERS
from hvdflow.training.reader import default_reader

# Models trained on graphs rather than images; only the benchmark runs them.
GRAPH_MODELS = ("gcn",)
DEFAULT_REGISTERED_MODEL = "hvdflow-classifier"


def image_models() -> list[str]:
    return model_names()


def model_recipe(model: str):
    """The model's training defaults (a ``Recipe``); None for an unknown one. The graph model
    trains full-batch: its ranks split one batch, so its rate needs no scaling."""
    if model in GRAPH_MODELS:
        return Recipe("adam", 0.01, 0.0)
    return recipe(model) if model in image_models() else None


def default_engine() -> str:
    """Horovod where it is installed (the classic profile), else TensorFlow's collectives."""
    return c.HOROVOD if extras.installed(extras.HOROVOD) else c.TF_COLLECTIVE


class TrainingParams(BaseModel):
    """What to train and how: the same for every rank and for the benchmark's baseline."""

    # A rejected weights_source may hold a password: errors name it redacted, never as given.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    model: str = "digits_mlp"
    framework: Literal["tensorflow", "torch"] = Field(
        default=DEFAULT_FRAMEWORK,
        description="what trains the model: 'tensorflow' (Keras, on launcher.engine) or "
        "'torch' (PyTorch DistributedDataParallel on the launcher's torch engine, "
        "hvdflow[torch]; digits_mlp and mnist_cnn)",
    )
    epochs: int = Field(default=3, ge=1)
    batch_size: int = Field(
        default=32,
        ge=1,
        description="images a step: of each rank, or with global_batch of all ranks together",
    )
    global_batch: bool | None = Field(
        default=None,
        description="true: batch_size is the global batch, split among the np ranks, and the "
        "learning rate stays the one-rank rate (no scaling, no warm-up); false: every rank "
        "trains batch_size, and the rate follows lr_scaling; None: the model's "
        "(docs/learning-rate.md)",
    )
    optimizer: str = Field(
        default="",
        description=f"one of {', '.join(OPTIMIZERS)}; '' the model's own (with its learning "
        "rate and warm-up, hvdflow.training.models)",
    )
    learning_rate: float | None = Field(
        default=None,
        gt=0,
        description="for one rank; lr_scaling scales it for np ranks. None: the model's rate, "
        "or the optimizer's customary one when the optimizer is given",
    )
    lr_scaling: Literal["auto", "linear", "sqrt", "none"] = Field(
        default="auto",
        description="how the learning rate follows np: 'linear' (x np, Goyal et al.: SGD, "
        "Adadelta), 'sqrt' (x sqrt(np): Adam, RAdam, RMSprop), 'none'; 'auto' by optimizer",
    )
    warmup_epochs: float | None = Field(
        default=None,
        ge=0,
        description="epochs over which the rate climbs from learning_rate to its scaled value "
        "(gradual warm-up); None: the model's",
    )
    chance_margin: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="a run whose final val_accuracy is not above chance (1/classes) by this "
        "much is marked failed and its model not registered",
    )
    eval_every: float = Field(
        default=0.0,
        ge=0,
        description="evaluate a fixed subset of eval_images validation images every this "
        "fraction of an epoch (0.1: ten times an epoch), logged as 'Evaluation at step ...' "
        "lines; 0: at epoch ends only",
    )
    eval_images: int = Field(
        default=1024, ge=1, description="the validation subset's size for eval_every"
    )
    seed: int = 0
    checkpoints: str = Field(
        default="",
        description="where rank 0 writes a checkpoint every epoch, under a folder per MLflow "
        "run: a path or s3://bucket/prefix; '' the object store (HVDFLOW_BUCKET/HVDFLOW_PREFIX"
        "/checkpoints); 'off' none (a failed training then starts over)",
    )
    checkpoint_keep: int = Field(default=2, ge=1, description="newest checkpoints kept")
    in_memory_max_mb: float = Field(
        default=1024.0,
        ge=0,
        description="a rank whose share of the data decodes to at most this many MB reads it "
        "once and trains from memory; 0 always streams it",
    )
    reader: Literal["petastorm", "pyarrow"] = Field(
        default_factory=default_reader,
        description="how ranks read the dataset: 'petastorm' (its reader, which unpickles the "
        "schema in _common_metadata), or 'pyarrow' (the split's _hvdflow_schema.json and its "
        "row groups, no pickle; the same rows in the same order); default: petastorm where it "
        "is installed (hvdflow[petastorm]), else pyarrow",
    )
    mixed_precision: bool = Field(
        default=False,
        description="Keras' mixed_float16 policy: float16 compute, float32 variables (pays off "
        "on GPUs with tensor cores; slower on CPUs)",
    )
    profile_batches: tuple[int, int] = Field(
        default=(0, 0),
        description="TensorFlow's profiler on rank 0 over the training's batches [start, stop), "
        "counted from 0 over the whole training (Keras' TensorBoard profile_batch): the "
        "profile goes to the MLflow run's artifacts under 'profile/', which TensorBoard's "
        "profile tab reads, and where a step's time goes to its metrics; [0, 0]: none",
    )
    weights_source: str = Field(
        default=OFFLINE_SOURCE,
        description=f"initial weights, staged once to the bucket: an http(s) URL, a file, or "
        f"{OFFLINE_SOURCE!r}; '' trains from scratch. A URL with a password or a signed query "
        "belongs in a reference, 'env:NAME' (the driver's variable NAME) or 'secret:block-name' "
        "(a Secret block, hvdflow.infra.secrets): parameters and logs then hold only the "
        "reference; such a literal is refused",
        # A server that checks parameters against this schema refuses such a literal unstored.
        json_schema_extra={"not": {"pattern": SECRET_URL_PATTERN}},
    )

    @model_validator(mode="before")
    @classmethod
    def _model_recipe(cls, data):
        """Fill in what the user left to the model: its optimizer, rate and warm-up."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        model = str(data.get("model") or "digits_mlp").lower()
        defaults = model_recipe(model)
        if defaults is None:  # an unknown model: the field's validator names the choices
            return data
        optimizer = str(data.get("optimizer") or "")
        if not optimizer:
            data["optimizer"] = defaults.optimizer
            if data.get("learning_rate") is None:
                data["learning_rate"] = defaults.learning_rate
        elif data.get("learning_rate") is None:
            data["learning_rate"] = DEFAULT_LEARNING_RATES.get(optimizer.lower(), 0.001)
        if data.get("warmup_epochs") is None:
            data["warmup_epochs"] = defaults.warmup_epochs
        if data.get("global_batch") is None:
            data["global_batch"] = defaults.global_batch
        return data

    @model_validator(mode="after")
    def _framework_can_train_it(self) -> TrainingParams:
        """What the framework's row (``hvdflow.training.frameworks``) says it cannot do."""
        row = framework(self.framework)
        asked = f"training.framework={self.framework!r}"
        if row.extra is not None:
            extras.require(row.extra, asked, f"framework={DEFAULT_FRAMEWORK!r}")
        models = row.model_names()
        if models is not None and self.model not in models:
            raise ValueError(
                f"{asked} with model {self.model!r}: {row.label} trains "
                f"{', '.join(models[:-1])} or {models[-1]}; "
                f"train {self.model} with framework {DEFAULT_FRAMEWORK!r}"
            )
        for name in row.refuses:
            if getattr(self, name) != type(self).model_fields[name].default:
                raise ValueError(
                    f"training.{name} is not for {row.label}: leave it at its default with {asked}"
                )
        return self

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str) -> str:
        known = [*image_models(), *GRAPH_MODELS]
        if model.lower() not in known:
            raise ValueError(f"model {model!r} is unknown: expected one of {', '.join(known)}")
        return model.lower()

    @field_validator("optimizer")
    @classmethod
    def _known_optimizer(cls, optimizer: str) -> str:
        if optimizer.lower() not in OPTIMIZERS:
            raise ValueError(
                f"optimizer {optimizer!r} is unknown: expected one of {', '.join(OPTIMIZERS)}"
            )
        if optimizer.lower() == "radam":
            extras.require(
                extras.ADDONS, "training.optimizer='radam'", "adadelta, rmsprop, adam or sgd"
            )
        return optimizer.lower()

    @field_validator("reader")
    @classmethod
    def _reader_installed(cls, reader: str) -> str:
        if reader == "petastorm":
            extras.require(extras.PETASTORM, "training.reader='petastorm'", "reader='pyarrow'")
        return reader

    @field_validator("profile_batches")
    @classmethod
    def _profile_range(cls, batches: tuple[int, int]) -> tuple[int, int]:
        start, stop = batches
        if (start, stop) != (0, 0) and not 0 <= start < stop:
            raise ValueError(
                f"profile_batches [{start}, {stop}]: expected [start, stop] with "
                "0 <= start < stop (batches counted from 0 over the whole training), or [0, 0] "
                "for no profile"
            )
        return batches

    @field_validator("weights_source")
    @classmethod
    def _weights_source_syntax(cls, source: str) -> str:
        if source in ("", OFFLINE_SOURCE):
            return source
        if not is_reference(source):
            if what := literal_secret(source):
                raise ValueError(f"weights_source {redact(source)!r} {what}: {BY_REFERENCE}")
            _check_weights_source(source, shown=repr(redact(source)))
            return source
        check_reference(source, "weights_source")
        if source.startswith(ENV_PREFIX):
            # Checked now, where the flow runs; a Secret block is read only when staging.
            try:
                value = resolve(source, "weights_source")
            except RuntimeError as e:
                raise ValueError(str(e)) from None
            _check_weights_source(value, shown=f"{source!r} (= {redact(value)!r})")
        return source


def _check_weights_source(source: str, shown: str) -> None:
    """ValueError unless ``source`` is an http(s) URL with a host or an existing file."""
    if source == OFFLINE_SOURCE:
        return
    parts = urlsplit(source)
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise ValueError(f"weights_source {shown}: the URL has no host")
        return
    local = parts.path if parts.scheme == "file" else source
    if parts.scheme not in ("", "file") or not os.path.isfile(local):
        raise ValueError(
            f"weights_source {shown} is neither an http(s) URL, an existing file, nor "
            f"{OFFLINE_SOURCE!r} ('' trains from scratch; 'env:NAME' or 'secret:block-name' "
            "name a secret URL)"
        )


# LaunchOptions' settings the pipeline takes, flat under ``launcher``, with LaunchOptions' types
# and checks (docs/horovodrunner.md); the run gives the rest. Two defaults differ: the trainers
# report every batch, so ten minutes without one is a stall (a user's function on HorovodRunner
# may report none); and the engine is whichever is installed (HorovodRunner's is Horovod), over
# Spark Connect the executors' (``LauncherParams.for_session``).
PipelineLaunchSettings = launch_settings(
    "engine",
    "start_timeout_s",
    "heartbeat_timeout_s",
    "stall_timeout_s",
    "relay",
    "horovod",
    choices={"engine": c.PIPELINE_ENGINES},
    engine=default_engine,
    stall_timeout_s=600.0,
)


class LauncherParams(PipelineLaunchSettings):
    """How many ranks, on which Spark, how often to try again; and the launcher's own settings
    (``PipelineLaunchSettings``): ``launch_options()`` makes them the runner's options."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    np: int = Field(default=2, description="ranks: > 0 on Spark, < 0 that many on the driver")
    spark_master: str | None = Field(
        default=None,
        description="a Spark master (local[N], spark://host:7077, yarn, ...) or a Spark "
        "Connect URL (sc://host:15002); default: $HVDFLOW_SPARK_MASTER, else $SPARK_REMOTE, "
        "else local[N]",
    )
    retries: int = Field(
        default=2,
        ge=0,
        description="times a training that failed transiently (a rank killed, a host lost, a "
        "stall) runs again, resuming from its last checkpoint in the same MLflow run",
    )
    min_np: int | None = Field(
        default=None,
        ge=1,
        description="elastic: when an attempt fails and fewer than np task slots are left, "
        "the next attempt runs on those left, from the last checkpoint in the same MLflow run, "
        "if they are at least min_np (default: np, not elastic); it grows back to np when the "
        "slots come back",
    )
    elastic_wait_s: float = Field(
        default=20.0,
        ge=0.0,
        description="elastic: how long a failed attempt waits for np task slots (an executor "
        "Spark relaunches, a host that comes back) before it goes on with the slots left",
    )

    @model_validator(mode="after")
    def _min_np_fits(self) -> LauncherParams:
        if self.min_np is not None and (self.np < 0 or self.min_np > self.np):
            raise ValueError(
                f"launcher.min_np={self.min_np} with np={self.np}: expected 1 <= min_np <= np, "
                "on the Spark cluster (np > 0)"
            )
        return self

    @property
    def fewest_ranks(self) -> int:
        """The fewest ranks an attempt may run on: min_np, else np (not elastic)."""
        return self.min_np if self.min_np is not None else self.np

    @field_validator("horovod")
    @classmethod
    def _no_literal_secret(cls, horovod: HorovodOptions) -> HorovodOptions:
        for name, value in horovod.extra_env.items():
            if what := literal_secret(value, name):
                raise ValueError(f"horovod.extra_env[{name!r}] {what}: {BY_REFERENCE}")
        return horovod

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_for_the_pipeline(cls, engine):
        if engine not in c.PIPELINE_ENGINES:
            raise ValueError(
                f"launcher.engine={engine!r}: expected one of {', '.join(c.PIPELINE_ENGINES)} "
                "(a PyTorch training runs on torch's: training.framework='torch')"
            )
        return engine

    @model_validator(mode="after")
    def _horovod_installed(self) -> LauncherParams:
        # Over Spark Connect the executors are asked at launch: a thin client holds no Horovod.
        if self.engine == c.HOROVOD and not is_connect_url(self.spark_master or default_master()):
            extras.require(extras.HOROVOD, "launcher.engine='horovod'", "engine='tf_collective'")
        return self

    def for_session(self, spark) -> LauncherParams:
        """These settings for ``spark``: over Spark Connect, a default engine is the executors'."""
        if spark is None or "engine" in self.model_fields_set or not is_connect(spark):
            return self
        return self.model_copy(update={"engine": executor_python.default_engine(spark)})

    @field_validator("np")
    @classmethod
    def _nonzero(cls, np: int) -> int:
        if np == 0:
            raise ValueError(
                "np=0: expected the number of ranks, > 0 on the Spark cluster or < 0 for that "
                "many processes on the driver"
            )
        return np


class TrackingParams(BaseModel):
    """Where MLflow records the run and registers the model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    experiment: str = Field(default="hvdflow", min_length=1)
    registered_model_name: str = Field(default=DEFAULT_REGISTERED_MODEL, min_length=1)
    resume: str = Field(
        default="",
        description="continue a training that failed for good, in its MLflow run, from its last "
        "checkpoint: 'last' (the experiment's newest failed run) or a run id; '' a new run",
    )


__all__ = ["DataParams", "InputFormat"]
