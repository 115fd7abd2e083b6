"""The frameworks a training can run on, as one table: what trains, on which engine, which models,
whether it starts from staged weights, which parameters it refuses, and the extra it needs.

Everything that differs by framework reads it here, so ``training.framework`` is compared in this
module only. Light: the parameters import it; trainers and model lists load when asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from hvdflow.infra import extras
from hvdflow.infra.constants import TORCH

TENSORFLOW = "tensorflow"
DEFAULT = TENSORFLOW


@dataclass(frozen=True)
class Framework:
    """One framework's row. ``label``: its name in messages; ``trainer``: the rank's training
    function, as ``module:function``; ``engine``: the launcher engine it always runs on (None:
    the launcher's ``engine`` parameter); ``models``: where its model names are listed
    (``module:NAME``; None: every image model); ``stages_weights``: it starts from weights
    staged to the bucket (Keras files); ``refuses``: TrainingParams fields it cannot honour,
    which must stay at their defaults; ``extra``: the optional part it needs
    (``hvdflow.infra.extras``); ``study``: the benchmark's conditions train with it."""

    name: str
    label: str
    trainer: str
    engine: str | None = None
    models: str | None = None
    stages_weights: bool = False
    refuses: tuple[str, ...] = ()
    extra: str | None = None
    study: bool = False

    def training_function(self):
        module, name = self.trainer.split(":")
        return getattr(importlib.import_module(module), name)

    def model_names(self) -> tuple[str, ...] | None:
        if self.models is None:
            return None
        module, name = self.models.split(":")
        return tuple(getattr(importlib.import_module(module), name))


FRAMEWORKS = {
    TENSORFLOW: Framework(
        TENSORFLOW,
        "TensorFlow",
        trainer="hvdflow.training.trainer:train_classifier",
        stages_weights=True,
        study=True,
    ),
    TORCH: Framework(
        TORCH,
        "PyTorch",
        trainer="hvdflow.training.torch_trainer:train_classifier_torch",
        engine=TORCH,
        models="hvdflow.training.torch_models:TORCH_MODELS",
        refuses=("mixed_precision", "eval_every", "profile_batches"),
        extra=extras.TORCH,
    ),
}


def framework(name: str) -> Framework:
    """The table's row for ``name`` (a validated ``training.framework``)."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise ValueError(
            f"training.framework {name!r} is unknown: expected one of {', '.join(FRAMEWORKS)}"
        ) from None
