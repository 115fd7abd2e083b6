"""What a rank's training returns: one frozen value that crosses the pickle back to the driver.

Rank 0's ``RankResult`` comes back as HorovodRunner's return value or, from the benchmark's
baseline process, as one JSON line (``to_dict``/``from_dict``). Every trainer returns this one
shape of plain values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankResult:
    """A training as rank 0 saw it. ``history`` and ``epoch_times`` cover every epoch of the
    training, those of the checkpoint it resumed from (``resumed_from_epoch`` of them) first."""

    size: int  # the ranks that trained
    history: dict[str, tuple[float, ...]]  # Keras' metrics by name, one value per epoch
    epoch_times: tuple[float, ...]  # seconds per epoch, measured inside the rank
    train_seconds: float  # this run's training itself (model.fit), launch left out
    steps_per_epoch: int  # per rank
    images_per_epoch: int  # over all ranks (the GCN: labelled nodes trained on)
    resumed_from_epoch: int = 0
    scaled_learning_rate: float | None = None  # the rate after scaling by the ranks
    warmup_steps: int = 0
    stopped: str | None = None  # why the training stopped early (it diverged); None: it did not
    rejected: str | None = None  # why the model is not registered; None: it was not rejected
    model_version: str | None = None  # the registered version, when rank 0 registered one
    evaluation: dict[str, Any] | None = None  # mlflow.models.evaluate's metrics and artifacts
    profile: dict[str, Any] | None = None  # the profile rank 0 logged to the tracking run

    @property
    def epochs_run(self) -> int:
        """The epochs this run trained, those of the checkpoint it resumed from left out."""
        return len(self.epoch_times) - self.resumed_from_epoch

    @property
    def final_val_accuracy(self) -> float | None:
        """The last epoch's val_accuracy; None when there was no validation."""
        return (self.history.get("val_accuracy") or (None,))[-1]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; ``from_dict`` gives the same result back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RankResult:
        values = dict(values)
        values["history"] = {k: tuple(v) for k, v in values["history"].items()}
        values["epoch_times"] = tuple(values["epoch_times"])
        return cls(**values)
