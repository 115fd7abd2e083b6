"""The study's setup, in one place: the benchmark flow's defaults (``hvdflow bench``).

The paper's MNIST setup (and Databricks' example): the MNIST CNN, batch 128, Adadelta at its
customary rate; a small validation split, since the study times training. The paper's batch was
per rank; the CNN's recipe now keeps 128 as the global batch, split among the ranks, which made
np=2 reach the target sooner in every repetition (docs/learning-rate.md, "Global batch or
per-rank batch").
"""

from __future__ import annotations

STUDY_DATA = {"image_size": (28, 28), "val_fraction": 0.05}
STUDY_TRAINING = {
    "model": "mnist_cnn",
    "batch_size": 128,
    "learning_rate": 1.0,
    "optimizer": "adadelta",
    # '' trains from scratch; a source is staged once and loaded by every rank.
    "weights_source": "",
    # Time to accuracy at a tenth of an epoch's resolution (training.interval_eval).
    "eval_every": 0.1,
}
