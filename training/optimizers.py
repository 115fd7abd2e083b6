"""Optimizers the paper compared, built by name, and how their learning rate follows the ranks.

With ``global_batch`` the one-rank batch is split among the ranks (``rank_batch_size``): the
model takes the same steps at the same rate as on one rank. Without it (Horovod's convention)
the global batch grows to ``ranks x batch_size``, and the learning rate must follow, with a
warm-up, or it diverges in the first steps:

- ``linear`` (Goyal et al., 2017): ``lr x ranks``, for SGD with momentum; Horovod's examples
  scale Adadelta the same way (the paper's MNIST setup).
- ``sqrt`` (Malladi et al., 2022; Hoffer et al., 2017): ``lr x sqrt(ranks)`` for Adam-like
  optimizers, whose steps are already normalised by the gradients' second moment.

``auto`` picks the rule by optimizer (AUTO_SCALING); ``none`` keeps ``lr`` whatever the ranks.
The warm-up is a schedule inside the optimizer (``training.warmup``), so both engines and a
resumed checkpoint follow it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hvdflow.infra import extras

OPTIMIZERS = ("adadelta", "rmsprop", "adam", "radam", "sgd")
SCALING_RULES = ("auto", "linear", "sqrt", "none")
# The rule ``auto`` picks.
AUTO_SCALING = {
    "sgd": "linear",
    "adadelta": "linear",
    "adam": "sqrt",
    "radam": "sqrt",
    "rmsprop": "sqrt",
}
# Each optimizer's customary learning rate, used when a run names the optimizer but no rate.
DEFAULT_LEARNING_RATES = {
    "sgd": 0.01,
    "adadelta": 1.0,
    "adam": 0.001,
    "radam": 0.001,
    "rmsprop": 0.001,
}
# SGD as Goyal et al. ran it: with momentum (plain SGD needs far more epochs to get anywhere).
SGD_MOMENTUM = 0.9


@dataclass(frozen=True)
class LearningRatePlan:
    """The learning rate a run trains with: ``base`` scaled by ``rule`` for ``ranks``, reached
    after ``warmup_steps`` optimizer steps that start at ``base``."""

    base: float
    ranks: int
    rule: str  # linear, sqrt or none: never auto
    warmup_steps: int

    @property
    def target(self) -> float:
        return scaled_learning_rate(self.base, self.ranks, self.rule)

    def describe(self) -> str:
        """How the rate was made, e.g. ``0.02 (0.01 x 2 ranks, lr_scaling 'linear'; ...)``."""
        if self.target == self.base:
            return f"{self.base:g} (lr_scaling {self.rule!r}, {self.ranks} rank(s))"
        factor = f"{self.ranks}" if self.rule == "linear" else f"sqrt({self.ranks})"
        warmup = (
            f"; warm-up from {self.base:g} over {self.warmup_steps} steps"
            if self.warmup_steps
            else "; no warm-up"
        )
        return (
            f"{self.target:.4g} ({self.base:g} x {factor} ranks, lr_scaling {self.rule!r}{warmup})"
        )

    def at_step(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (from 0): a straight line from ``base``
        to ``target`` over the warm-up."""
        if step >= self.warmup_steps:
            return self.target
        return self.base + (self.target - self.base) * step / self.warmup_steps


def rank_batch_size(batch_size: int, ranks: int, global_batch: bool) -> int:
    """Images each rank trains per step: with ``global_batch``, ``batch_size`` split among the
    ranks (at least one each), else ``batch_size``."""
    return max(1, batch_size // max(1, abs(ranks))) if global_batch else batch_size


def resolve_scaling(optimizer: str, rule: str = "auto") -> str:
    """The rule ``rule`` means for ``optimizer``: ``auto`` picks by optimizer."""
    if rule not in SCALING_RULES:
        raise ValueError(f"lr_scaling {rule!r} is unknown: expected one of {SCALING_RULES}")
    if rule != "auto":
        return rule
    key = optimizer.lower()
    if key not in AUTO_SCALING:
        raise ValueError(f"optimizer {optimizer!r} is unknown: expected one of {OPTIMIZERS}")
    return AUTO_SCALING[key]


def scaled_learning_rate(learning_rate: float, ranks: int, rule: str = "linear") -> float:
    """``learning_rate`` for ``ranks`` ranks under ``rule`` (linear, sqrt or none)."""
    ranks = abs(ranks)
    if rule == "linear":
        return learning_rate * ranks
    if rule == "sqrt":
        return learning_rate * math.sqrt(ranks)
    if rule == "none":
        return learning_rate
    raise ValueError(f"lr_scaling {rule!r} is not a rule: expected linear, sqrt or none")


def learning_rate_plan(
    optimizer: str,
    learning_rate: float,
    ranks: int,
    rule: str = "auto",
    warmup_epochs: float = 0.0,
    steps_per_epoch: int = 1,
    global_batch: bool = False,
) -> LearningRatePlan:
    """The plan for ``ranks`` ranks; no warm-up where there is nothing to warm up to. A global
    batch kept whatever the ranks keeps the one-rank rate (rule ``none``)."""
    resolved = "none" if global_batch else resolve_scaling(optimizer, rule)
    plan = LearningRatePlan(learning_rate, abs(ranks), resolved, 0)
    if plan.target == plan.base or warmup_epochs <= 0:
        return plan
    return LearningRatePlan(
        learning_rate, abs(ranks), resolved, max(1, round(warmup_epochs * steps_per_epoch))
    )


def make_optimizer(name: str, learning_rate):
    """A Keras optimizer; ``learning_rate`` a float or a Keras schedule. ``radam`` is Rectified
    Adam from tensorflow-addons (as in the paper); ``sgd`` has momentum SGD_MOMENTUM."""
    import tensorflow as tf

    key = name.lower()
    if key == "adadelta":
        return tf.keras.optimizers.Adadelta(learning_rate)
    if key == "rmsprop":
        return tf.keras.optimizers.RMSprop(learning_rate)
    if key == "adam":
        return tf.keras.optimizers.Adam(learning_rate)
    if key == "sgd":
        return tf.keras.optimizers.SGD(learning_rate, momentum=SGD_MOMENTUM)
    if key == "radam":
        extras.require(extras.ADDONS, "optimizer 'radam'", "adadelta, rmsprop, adam or sgd")
        import tensorflow_addons as tfa

        return tfa.optimizers.RectifiedAdam(learning_rate)
    raise ValueError(f"optimizer {name!r} is unknown: expected one of {OPTIMIZERS}")


def make_planned_optimizer(name: str, plan: LearningRatePlan):
    """The optimizer with ``plan``'s learning rate: a constant, or the warm-up schedule."""
    if plan.warmup_steps == 0:
        return make_optimizer(name, plan.target)
    from hvdflow.training.warmup import WarmupSchedule  # noqa: PLC0415 (lazy: it loads TensorFlow)

    return make_optimizer(name, WarmupSchedule(plan.base, plan.target, plan.warmup_steps))
