"""Evaluating the registered model as MLflow users do: ``mlflow.models.evaluate`` on the
validation split, right after rank 0 logged it.

The predictions are the logged model's own answers (its ``probabilities``, what a served or batch
prediction computes) on the validation images as the network takes them; MLflow's default
classifier evaluator turns them into its metrics (accuracy, F1, precision, recall, log loss)
and a confusion matrix picture, logged to the training run and linked to the logged model
(MLflow 3's model page shows them). The validation split is read whole, up to
``MAX_IMAGES`` images: evaluation is a report, not a second training.
"""

from __future__ import annotations

import numpy as np

MAX_IMAGES = 10_000


def evaluate_logged(model_info, classifier, val_url: str, reader: str | None = None) -> dict:
    """Evaluate ``classifier`` (the ImageClassifier that ``model_info`` logged, network loaded)
    on the validation split at ``val_url`` (read by ``reader``, as training read it), in the
    active MLflow run. Returns ``{"metrics":
    {...}, "artifacts": {name: uri}, "images": n}``."""
    import mlflow
    import pandas as pd

    from hvdflow.training.reader import open_dataset  # noqa: PLC0415 (lazy: it loads NumPy)

    images, targets = [], []
    with open_dataset(val_url, batch_size=256, num_epochs=1, shuffle=False, reader=reader) as val:
        for batch_images, batch_labels in val:
            images.append(batch_images.numpy())
            targets.append(batch_labels.numpy())
            if sum(len(t) for t in targets) >= MAX_IMAGES:
                break
    if not targets:
        return {"metrics": {}, "artifacts": {}, "images": 0}
    x = np.concatenate(images)[:MAX_IMAGES]
    y = np.concatenate(targets)[:MAX_IMAGES]
    predicted = classifier.probabilities(x).argmax(axis=1)
    data = pd.DataFrame({"label": y.astype(np.int64), "prediction": predicted.astype(np.int64)})
    result = mlflow.models.evaluate(
        data=data,
        targets="label",
        predictions="prediction",
        model_type="classifier",
        model_id=getattr(model_info, "model_id", None),
        evaluator_config={"log_model_explainability": False},
    )
    metrics = {k: float(v) for k, v in result.metrics.items() if np.isscalar(v)}
    artifacts = {name: artifact.uri for name, artifact in result.artifacts.items()}
    return {"metrics": metrics, "artifacts": artifacts, "images": len(y)}
