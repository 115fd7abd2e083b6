"""What a rank is asked to train: one frozen value that crosses the pickle to every rank.

Built by ``hvdflow.tasks.train.spec.training_spec`` or the benchmark. Plain values only, so it
pickles small, prints without secrets (credentials never travel in it) and goes through JSON to
the benchmark's baseline process (``to_dict``/``from_dict``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hvdflow.infra.constants import HOROVOD
from hvdflow.training.reader import default_reader


@dataclass(frozen=True)
class DataSpec:
    """The dataset a rank reads its shard of (a published ``DatasetManifest``, reduced)."""

    train_url: str
    val_url: str
    train_rows: int
    val_rows: int
    num_classes: int
    input_shape: tuple[int, ...]  # the stored image's (height, width, channels)
    labels: tuple[str, ...] = ()  # class names by label index: they travel inside the model


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer and how its rate follows the number of ranks (``training.optimizers``)."""

    name: str = "adam"
    learning_rate: float = 0.001  # for one rank
    lr_scaling: str = "auto"
    warmup_epochs: float = 0.0


@dataclass(frozen=True)
class TrackingSpec:
    """Where rank 0 logs epochs and registers the model: an MLflow run the driver opened."""

    run_id: str
    tracking_uri: str | None = None
    registered_model_name: str | None = None


@dataclass(frozen=True)
class TrainSpec:
    """Everything ``train_classifier`` needs. ``use_horovod=False`` is the benchmark's plain
    Keras baseline: one process, no engine. ``chance_margin``: a model no better than chance by
    this much is not registered (None: nothing is judged, as the benchmark times training)."""

    data: DataSpec
    model_name: str
    # "tensorflow" (training.trainer) or "torch" (training.torch_trainer)
    framework: str = "tensorflow"
    epochs: int = 2
    batch_size: int = 32  # per rank; with global_batch, of all ranks together
    # True: batch_size is the global batch, split among the ranks, and the learning rate stays
    # the one-rank rate (training.optimizers.rank_batch_size)
    global_batch: bool = False
    seed: int = 0
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    weights_uri: str | None = None
    weights_sha256: str | None = None
    tracking: TrackingSpec | None = None
    checkpoint_url: str | None = None
    checkpoint_keep: int = 2
    engine: str = HOROVOD
    use_horovod: bool = True
    mixed_precision: bool = False  # Keras' mixed_float16 policy, float32 output
    fp16_compression: bool = False  # Horovod sends gradients as float16
    threads: int | None = None  # TensorFlow threads of the process; None: its share of cores
    in_memory_max_mb: float = 1024.0  # a shard decoding to at most this stays in memory; 0: stream
    # training.reader: "petastorm" or "pyarrow"; default: petastorm where it is installed
    reader: str = field(default_factory=default_reader)
    chance_margin: float | None = None
    # An evaluation of a fixed subset of eval_images validation images every eval_every of an
    # epoch (training.interval_eval); 0: at epoch ends only, as Keras does
    eval_every: float = 0.0
    eval_images: int = 1024
    # TensorFlow's profiler over batches [start, stop) of the whole training; (0, 0): none. With
    # a profile_dir every rank writes ``<profile_dir>/rank<N>``; without, rank 0 alone profiles
    # and logs it to the tracking run.
    profile_dir: str | None = None
    profile_batches: tuple[int, int] = (0, 0)

    def replace(self, **changes: Any) -> TrainSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; ``from_dict`` gives the same spec back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainSpec:
        values = dict(values)
        data = dict(values.pop("data"))
        data["input_shape"] = tuple(data["input_shape"])
        data["labels"] = tuple(data.get("labels", ()))
        tracking = values.pop("tracking", None)
        if "profile_batches" in values:
            values["profile_batches"] = tuple(values["profile_batches"])
        return cls(
            data=DataSpec(**data),
            optimizer=OptimizerSpec(**values.pop("optimizer", {})),
            tracking=TrackingSpec(**tracking) if tracking else None,
            **values,
        )
