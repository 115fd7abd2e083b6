"""Goyal et al.'s gradual warm-up as a Keras learning-rate schedule (see ``optimizers``).

A schedule rather than a callback (Horovod's ``LearningRateWarmupCallback``): it lives inside the
optimizer, so the TensorFlow-collectives engine follows it as Horovod does, it reads the
optimizer's own step counter, which a checkpoint restores (a resumed run continues the warm-up
where it stopped), and every rank computes the same rate without talking to the others.
"""

from __future__ import annotations

import tensorflow as tf


@tf.keras.saving.register_keras_serializable(package="hvdflow")
class WarmupSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
    """From ``initial`` at step 0 in a straight line to ``target`` at ``warmup_steps``, then
    ``target``. Registered for serialisation: ``hvd.DistributedOptimizer`` rebuilds the
    optimizer from its config."""

    def __init__(self, initial: float, target: float, warmup_steps: int):
        super().__init__()
        self.initial = float(initial)
        self.target = float(target)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        done = tf.minimum(step / float(max(self.warmup_steps, 1)), 1.0)
        return self.initial + (self.target - self.initial) * done

    def get_config(self) -> dict:
        return {
            "initial": self.initial,
            "target": self.target,
            "warmup_steps": self.warmup_steps,
        }
