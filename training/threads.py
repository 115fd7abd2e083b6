"""How many CPU threads a rank's TensorFlow may use: the ranks of a host share its cores."""

from __future__ import annotations

import os


def share_cores(local_size: int) -> int:
    """Threads for one rank so that the ranks on a host share its cores instead of fighting."""
    return max(1, (os.cpu_count() or 1) // max(1, local_size))


def use_threads(threads: int) -> None:
    """Limit this process's TensorFlow to ``threads`` (intra- and inter-op); call before any op."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
