"""Whether a training produced a model worth publishing: pure decisions on its metrics.

Two verdicts, both read from numbers every rank sees alike (epoch metrics averaged over ranks):

- ``divergence``: at the end of an epoch, a training loss that is not finite, or that is worse
  than guessing every class alike by DIVERGED_RATIO (cross-entropy ``ln(classes)``), has
  diverged. Training stops there: more epochs would not bring it back.
- ``rejection``: a finished training whose final ``val_accuracy`` is no better than chance
  (``1 / classes``) by ``margin``, or whose metrics are not finite, is refused: the run is marked
  failed in MLflow with the reason, and the model is not registered (so it never gets an alias).

The reasons name the setting to change, because a user meets them after a long run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

# A run must beat chance (1 / classes) by this much in val_accuracy to be published.
CHANCE_MARGIN = 0.05
# An epoch loss this many times a uniform guess's cross-entropy means the training diverged: a
# model that learned nothing scores about 1.0x; confident wrong answers push it above.
DIVERGED_RATIO = 1.25
# What the reasons tell the user to change.
LEARNING_RATE_ADVICE = (
    "lower training.learning_rate, lengthen training.warmup_epochs, or set "
    "training.lr_scaling='sqrt' (or 'none')"
)


def chance_accuracy(num_classes: int) -> float:
    return 1.0 / max(num_classes, 1)


def uniform_loss(num_classes: int) -> float:
    """The cross-entropy of a model that gives every class the same probability."""
    return math.log(max(num_classes, 2))


def divergence(
    epoch: int, logs: Mapping[str, float], num_classes: int, learning_rate: str = ""
) -> str | None:
    """Why training diverged at ``epoch`` (from 1) with epoch metrics ``logs``, or None.

    ``learning_rate``: how the rate was made (e.g. "0.02 (0.01 x 2 ranks, lr_scaling='linear')"),
    named in the reason."""
    loss = logs.get("loss")
    if loss is None:
        return None
    loss = float(loss)
    rate = f" with learning rate {learning_rate}" if learning_rate else ""
    if not math.isfinite(loss):
        return f"training diverged in epoch {epoch}{rate}: the loss is {loss}; " + (
            LEARNING_RATE_ADVICE
        )
    uniform = uniform_loss(num_classes)
    if loss > DIVERGED_RATIO * uniform:
        return (
            f"training diverged in epoch {epoch}{rate}: loss {loss:.3f} is worse than guessing "
            f"all {num_classes} classes alike ({uniform:.3f}) by more than {DIVERGED_RATIO}x; "
            + LEARNING_RATE_ADVICE
        )
    return None


def rejection(
    history: Mapping[str, Sequence[float]],
    num_classes: int,
    margin: float = CHANCE_MARGIN,
    learning_rate: str = "",
) -> str | None:
    """Why the model trained with ``history`` (metric -> one value per epoch) must not be
    published, or None when it may be."""
    for key in ("loss", "val_loss"):
        values = history.get(key) or []
        if values and not math.isfinite(float(values[-1])):
            return (
                f"the final {key} is {values[-1]}: the training diverged"
                + (f" with learning rate {learning_rate}" if learning_rate else "")
                + f"; {LEARNING_RATE_ADVICE}"
            )
    accuracies = history.get("val_accuracy") or history.get("accuracy") or []
    if not accuracies:
        return None  # nothing to judge by (no validation split and no accuracy metric)
    key = "val_accuracy" if history.get("val_accuracy") else "accuracy"
    final = float(accuracies[-1])
    chance = chance_accuracy(num_classes)
    if not math.isfinite(final) or final <= chance + margin:
        rate = f" with learning rate {learning_rate}" if learning_rate else ""
        return (
            f"final {key} {final:.3f} is no better than chance ({chance:.3f} for "
            f"{num_classes} classes, plus a margin of {margin}): the model trained{rate} "
            f"learned nothing useful and is not published; {LEARNING_RATE_ADVICE}, or train "
            "more epochs (training.epochs)"
        )
    return None
