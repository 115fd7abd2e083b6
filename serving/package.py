"""Packing a trained network (Keras, or PyTorch as TorchScript) into the registered model a
consumer can use alone.

``log_classifier`` logs an ``ImageClassifier`` pyfunc (``hvdflow.serving.classifier``): the
network as a ``.keras`` file, the class names and the input shape inside the model, the
signature and an input example of real image bytes, and requirements that name exactly what
the pyfunc imports at the versions that trained it (one TensorFlow distribution). The class and
the image code are pickled by value, so the model loads where hvdflow is not installed.
"""

from __future__ import annotations

import io
import os
import tempfile
from importlib.metadata import PackageNotFoundError, distribution

import cloudpickle
import numpy as np

from hvdflow.serving import METADATA_KEY, classifier, images

# What the pyfunc imports, by distribution; the TensorFlow distribution is whichever trained it.
REQUIRED = ("mlflow", "cloudpickle", "numpy", "pandas", "pillow")
TENSORFLOW_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-macos")


# Keras 2 beside TensorFlow 2.16+ (``classifier.keras_2``); TensorFlow 2.15 has it built in.
KERAS_2_DISTRIBUTION = "tf-keras"


def requirements() -> list[str]:
    """``name==version`` for each distribution the pyfunc imports, as installed here."""
    pins = [f"{name}=={distribution(name).version}" for name in REQUIRED]
    pins.append(tensorflow_requirement())
    try:
        pins.append(f"{KERAS_2_DISTRIBUTION}=={distribution(KERAS_2_DISTRIBUTION).version}")
    except PackageNotFoundError:
        pass
    return pins


def tensorflow_requirement() -> str:
    """The one TensorFlow distribution installed here (``tensorflow-cpu`` on hvdflow's stack),
    pinned: never both, which a fresh serving environment would install side by side."""
    for name in TENSORFLOW_DISTRIBUTIONS:
        try:
            return f"{name}=={distribution(name).version}"
        except PackageNotFoundError:
            continue
    raise RuntimeError(f"none of {', '.join(TENSORFLOW_DISTRIBUTIONS)} is installed")


def signature():
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, ParamSchema, ParamSpec, Schema

    inputs = Schema(
        [
            ColSpec("binary", "image", required=False),
            ColSpec(Array(Array(Array("double"))), "pixels", required=False),
        ]
    )
    outputs = Schema(
        [
            ColSpec("string", "class_name", required=False),
            ColSpec("long", "class_index", required=False),
            ColSpec("double", "probability", required=False),
            ColSpec("string", "error", required=False),
        ]
    )
    params = ParamSchema(
        [ParamSpec("top_k", "long", 1), ParamSpec("probabilities", "boolean", False)]
    )
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def png_bytes(prepared: np.ndarray) -> bytes:
    """A prepared input (height, width, channels) in [0, 1] as a PNG file: the input example."""
    from PIL import Image

    pixels = np.clip(np.rint(np.asarray(prepared) * 255.0), 0, 255).astype(np.uint8)
    if pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def torch_requirements() -> list[str]:
    """What a PyTorch classifier imports, pinned as installed here: one torch, no TensorFlow."""
    return [*(f"{name}=={distribution(name).version}" for name in REQUIRED), torch_requirement()]


def torch_requirement() -> str:
    return f"torch=={distribution('torch').version}"


def log_torch_classifier(
    scripted_path: str, input_shape, labels, example: np.ndarray, registered_model_name=None
):
    """Log a TorchScript network (the file at ``scripted_path``) as a TorchImageClassifier to
    the active MLflow run, as ``log_classifier`` logs a Keras one. Returns MLflow's ModelInfo."""
    from hvdflow.serving import torch_classifier  # noqa: PLC0415 (it names torch's artifact)

    shape = tuple(int(d) for d in input_shape)
    python_model = torch_classifier.TorchImageClassifier(labels, shape)
    return _log(
        python_model,
        {torch_classifier.TORCHSCRIPT_ARTIFACT: scripted_path},
        example,
        torch_requirements(),
        shape,
        labels,
        registered_model_name,
        (images, classifier, torch_classifier),
    )


def _log(python_model, artifacts, example, pip_requirements, shape, labels, name, modules):
    import mlflow
    import pandas as pd

    input_example = pd.DataFrame({"image": [png_bytes(example[0])]})
    # By value: the consumer's environment has no hvdflow to import these modules from.
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        return mlflow.pyfunc.log_model(
            name="model",
            python_model=python_model,
            artifacts=artifacts,
            signature=signature(),
            input_example=input_example,
            pip_requirements=pip_requirements,
            metadata={METADATA_KEY: {"input_shape": list(shape), "labels": list(labels)}},
            registered_model_name=name,
        )
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def log_classifier(network, labels, example: np.ndarray, registered_model_name=None):
    """Log ``network`` (Keras, uncompiled) as an ImageClassifier to the active MLflow run;
    ``example`` is a prepared input batch, whose first image becomes the input example.
    Returns MLflow's ModelInfo."""
    shape = tuple(int(d) for d in network.input_shape[1:])
    python_model = classifier.ImageClassifier(labels, shape)
    with tempfile.TemporaryDirectory(prefix="hvdflow-model-") as scratch:
        path = os.path.join(scratch, "network.keras")
        network.save(path)
        return _log(
            python_model,
            {classifier.KERAS_ARTIFACT: path},
            example,
            requirements(),
            shape,
            labels,
            registered_model_name,
            (images, classifier),
        )
