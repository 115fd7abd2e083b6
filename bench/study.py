"""The study's setup, in one place: the flow's defaults and the side-by-side scripts use it.

The paper's MNIST setup (and Databricks' example): the MNIST CNN, batch 128, Adadelta at its
customary rate; a small validation split, since the study times training. The paper's batch was
per rank; the CNN's recipe now keeps 128 as the global batch, split among the ranks, which made
np=2 reach the target sooner in every repetition (docs/learning-rate.md, "Global batch or
per-rank batch").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hvdflow.infra.storage.files import Location

if TYPE_CHECKING:
    from hvdflow.training.spec import TrainSpec

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


def study_spec(dataset_folder: str, epochs: int, threads: int = 1) -> TrainSpec:
    """What ``train_classifier`` trains in the study, on the dataset published in
    ``dataset_folder`` (the folder of its ``manifest.json``), ``threads`` per rank."""
    from hvdflow.tasks.config import TrainingParams  # noqa: PLC0415 (lazy: it loads NumPy)
    from hvdflow.tasks.preprocess.publish import read_manifest  # noqa: PLC0415 (lazy: it loads NumPy)
    from hvdflow.tasks.train.spec import training_spec  # noqa: PLC0415 (lazy: pydantic and NumPy)

    dataset = read_manifest(Location(dataset_folder))
    if dataset is None:
        raise SystemExit(f"--dataset {dataset_folder}: no complete published dataset there")
    # The side-by-side scripts measure steps of the paper's per-rank batch, as they did when
    # their figures went into BENCHMARKS.md.
    training = TrainingParams(**STUDY_TRAINING, epochs=epochs, global_batch=False)
    # Timed to the end whatever accuracy it reaches: no early stop, no verdict.
    # Nor evaluations every few steps: their figures had none.
    return training_spec(training, dataset).replace(
        threads=threads, chance_margin=None, eval_every=0.0
    )
