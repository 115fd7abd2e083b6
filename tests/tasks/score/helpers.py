"""For scoring tests: a model registered the way the pipeline does (without training it), and
held-out images with bad files among them."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

# Bad files of a held-out tree (relative path -> content) and the reasons they get.
BAD_FILES = {
    "3/broken.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",  # a PNG cut off in its header
    "notes.txt": b"seen 12 cats, 3 dogs\n",  # a text file at the top level
}


def write_digits(root: Path, indices, bad: bool = True) -> list[str]:
    """Real digits (scikit-learn's, 8x8 PNG) as ``<label>/digit_NNNN.png`` under ``root``, the
    BAD_FILES too; returns the good sources (paths relative to ``root``), sorted."""
    from PIL import Image

    from hvdflow.training.digits import bundled_digits

    images, labels = bundled_digits()
    good = []
    for i in indices:
        source = f"{labels[i]}/digit_{i:04d}.png"
        (root / source).parent.mkdir(parents=True, exist_ok=True)
        pixels = (images[i] * (255.0 / 16.0)).round().astype("uint8")
        Image.fromarray(pixels, mode="L").save(root / source)
        good.append(source)
    for source, data in BAD_FILES.items() if bad else ():
        (root / source).parent.mkdir(parents=True, exist_ok=True)
        (root / source).write_bytes(data)
    return sorted(good)


def model_predictions(model_uri: str, images: list[bytes], image_size, color_mode):
    """(class indices, probabilities of them) from the model's own ``predict``, as a registry
    consumer calls it: an ImageClassifier on the image files' bytes themselves; a bare Keras
    version (registered before the model carried its preprocessing) on the images decoded as
    preprocessing decodes them."""
    import mlflow.pyfunc
    import pandas as pd

    from hvdflow.serving.images import model_input
    from hvdflow.tasks.images.decode import decode_image

    # Into a folder that goes: without dst_path MLflow keeps a mkdtemp copy in /tmp for ever.
    with tempfile.TemporaryDirectory(prefix="hvdflow-test-model-") as dst:
        model = mlflow.pyfunc.load_model(model_uri, dst_path=dst)
    if "tensorflow" not in model.metadata.flavors:
        out = model.predict(pd.DataFrame({"image": images}))
        assert out["error"].isna().all(), out["error"]
        return out["class_index"].to_numpy(int), out["probability"].to_numpy(float)
    decoded = [
        decode_image("", "", data, image_size, color_mode, 50_000_000).image for data in images
    ]
    probabilities = np.asarray(model.predict(model_input(decoded)))
    classes = probabilities.argmax(axis=1)
    return classes, probabilities[np.arange(len(classes)), classes]


def read_files(root, sources: list[str]) -> list[bytes]:
    return [(Path(root) / source).read_bytes() for source in sources]


def register_model(
    tracking_uri: str,
    name: str,
    *,
    model: str = "digits_mlp",
    input_shape: tuple[int, int, int] = (8, 8, 1),
    labels: list[str] | None = None,
    num_classes: int = 10,
    alias: str | None = "champion",
    legacy: bool = False,
) -> str:
    """Log a freshly built (seeded) model as training/trainer.py does (an ImageClassifier
    carrying its labels), and the run's ``dataset/labels.json`` as tasks/train/run.py does;
    register it; return its version. ``legacy``: a bare Keras model with a signature, as
    versions were registered before the model carried its labels and preprocessing."""
    import mlflow
    import mlflow.tensorflow
    from mlflow import MlflowClient
    from mlflow.models import infer_signature

    from hvdflow.serving.package import log_classifier, requirements
    from hvdflow.training.models import build_model

    keras_model = build_model(model, input_shape, num_classes, seed=0)
    example = np.random.default_rng(0).random((4, *input_shape), dtype=np.float32)
    labels = labels if labels is not None else [f"digit-{i}" for i in range(num_classes)]
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("tests-score-models")
    with mlflow.start_run():
        mlflow.log_text(json.dumps({n: i for i, n in enumerate(labels)}), "dataset/labels.json")
        if legacy:
            info = mlflow.tensorflow.log_model(
                keras_model,
                name="model",
                signature=infer_signature(example, keras_model.predict(example, verbose=0)),
                registered_model_name=name,
                # Named, not inferred: inferring loads the model in a subprocess (seconds of CPU).
                pip_requirements=requirements(),
            )
        else:
            info = log_classifier(keras_model, labels, example, registered_model_name=name)
    version = str(info.registered_model_version)
    if alias:
        MlflowClient(tracking_uri).set_registered_model_alias(name, alias, version)
    return version
