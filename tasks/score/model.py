"""The model a scoring run uses, found on the driver: registry version, label map, shapes.

``fetch_model`` resolves a ``ModelRef`` in the MLflow registry, downloads that version once and
reads its input shape and class names: from its MLmodel metadata (an ``ImageClassifier``,
``hvdflow.serving``), or for a bare Keras model from the logged signature and the training run's
``dataset/labels.json``. ``check_*`` compare the resulting ``ScoringModel`` with the data before
any Spark work, so a model that cannot score these inputs fails in seconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

from hvdflow.infra.secrets import redact_url
from hvdflow.infra.storage.locks import cache_root
from hvdflow.serving import METADATA_KEY
from hvdflow.tasks.score.config import ModelRef

logger = logging.getLogger(__name__)

LABELS_ARTIFACT = "dataset/labels.json"  # what tasks/train/run.py logs beside the model
CHANNELS = {1: "L", 3: "RGB"}


@dataclass(frozen=True)
class ScoringModel:
    """One registered model version, ready to ship: plain values only."""

    name: str
    version: str
    run_id: str
    model_uuid: str  # MLmodel's id: with the URI, the executors' cache key
    input_shape: tuple[int | None, ...]  # (height, width, channels); None: any size
    num_outputs: int
    labels: tuple[str, ...]  # class names, in the order of the model's outputs
    local_dir: str  # the downloaded model, on the driver
    aliases: tuple[str, ...] = ()

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"

    @property
    def cache_key(self) -> tuple[str, str]:
        return (self.uri, self.model_uuid)


def fetch_model(ref: ModelRef, tracking_uri: str, workdir: str | None = None) -> ScoringModel:
    """Resolve ``ref`` in the registry at ``tracking_uri`` and download that version, once per
    driver machine (``$HVDFLOW_CACHE_DIR/models``: a registered version's files never change)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    version = resolve_version(client, ref)
    if workdir is None:
        identity = f"{redact_url(tracking_uri)}|{ref.name}|{version.version}|{version.run_id}"
        digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
        workdir = str(cache_root() / "models" / digest)
    os.makedirs(workdir, exist_ok=True)
    local_dir = download_model(ref.name, version.version, tracking_uri, workdir)
    model_uuid, input_shape, outputs = describe(local_dir)
    labels = carried_labels(local_dir)
    if labels is None:  # a version registered before the model carried its labels
        if not version.run_id:
            raise ValueError(
                f"model {ref.name!r} version {version.version} has no training run, so no "
                f"label map ({LABELS_ARTIFACT}): register a model that hvdflow trained"
            )
        labels = read_labels(client, version.run_id, workdir, f"{ref.name!r} v{version.version}")
    model = ScoringModel(
        name=ref.name,
        version=str(version.version),
        run_id=version.run_id,
        model_uuid=model_uuid,
        input_shape=input_shape,
        num_outputs=outputs,
        labels=tuple(labels),
        local_dir=local_dir,
        aliases=tuple(sorted(getattr(version, "aliases", None) or ())),
    )
    check_labels(model)
    logger.info("model %s (%s): input %s, %d classes", model.uri, ref.uri, input_shape, len(labels))
    return model


def resolve_version(client, ref: ModelRef):
    """The registry's ModelVersion for ``ref``; ValueError naming what exists instead."""
    from mlflow.exceptions import MlflowException

    try:
        registered = client.get_registered_model(ref.name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        names = sorted(m.name for m in client.search_registered_models(max_results=50))
        raise ValueError(
            f"registered model {ref.name!r} does not exist; registered models: "
            f"{', '.join(names) or 'none'} (train one with `hvdflow run`)"
        ) from None
    if ref.version:
        try:
            return client.get_model_version(ref.name, ref.version)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            found = client.search_model_versions(f"name='{ref.name}'")
            versions = sorted((int(v.version) for v in found), reverse=True)
            raise ValueError(
                f"model {ref.name!r} has no version {ref.version}; its versions: "
                f"{', '.join(map(str, versions)) or 'none'}"
            ) from None
    aliases = dict(registered.aliases or {})
    if ref.alias not in aliases:
        shown = ", ".join(f"{a} (version {v})" for a, v in sorted(aliases.items()))
        raise ValueError(
            f"model {ref.name!r} has no alias {ref.alias!r}; its aliases: {shown or 'none'}: "
            "pass one of them as alias, or a version number"
        )
    return client.get_model_version(ref.name, str(aliases[ref.alias]))


def read_labels(client, run_id: str, workdir: str, what: str) -> list[str]:
    """Class names in label-index order, from the run's ``dataset/labels.json``."""
    present = {a.path for a in client.list_artifacts(run_id, os.path.dirname(LABELS_ARTIFACT))}
    if LABELS_ARTIFACT not in present:
        raise ValueError(
            f"model {what}: its run {run_id} has no {LABELS_ARTIFACT} artifact, so class "
            "names are unknown; score a version that `hvdflow run` trained and registered"
        )
    path = client.download_artifacts(run_id, LABELS_ARTIFACT, workdir)
    with open(path, encoding="utf-8") as f:
        return labels_in_order(json.load(f), f"{what} ({LABELS_ARTIFACT} of run {run_id})")


def labels_in_order(label_index: dict[str, int], what: str) -> list[str]:
    """``{"cat": 1, "ant": 0}`` -> ``["ant", "cat"]``; ValueError unless indices are 0..n-1."""
    by_index = sorted((int(i), str(name)) for name, i in label_index.items())
    if [i for i, _ in by_index] != list(range(len(by_index))):
        raise ValueError(
            f"{what}: label indices {[i for i, _ in by_index]} are not 0..{len(by_index) - 1}"
        )
    return [name for _, name in by_index]


def download_model(name: str, version: str, tracking_uri: str, workdir: str) -> str:
    """The version's files in ``workdir/model``, renamed into place so they are always complete."""
    import mlflow.artifacts

    target = os.path.join(workdir, "model")
    if os.path.exists(os.path.join(target, "MLmodel")):
        return target
    partial = tempfile.mkdtemp(prefix="model-partial-", dir=workdir)
    try:
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{name}/{version}", dst_path=partial, tracking_uri=tracking_uri
        )
        try:
            os.rename(partial, target)
        except OSError:  # another run put it there first
            pass
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def carried_labels(local_dir: str) -> list[str] | None:
    """The class names an ImageClassifier carries; None for a bare Keras model."""
    from mlflow.models import Model

    meta = Model.load(os.path.join(local_dir, "MLmodel"))
    carried = (meta.metadata or {}).get(METADATA_KEY)
    return [str(label) for label in carried["labels"]] if carried else None


def describe(local_dir: str) -> tuple[str, tuple[int | None, ...], int]:
    """(model_uuid, input shape without the batch axis, outputs) of a downloaded model: carried,
    or from its logged signature, else the Keras model itself."""
    from mlflow.models import Model

    meta = Model.load(os.path.join(local_dir, "MLmodel"))
    carried = (meta.metadata or {}).get(METADATA_KEY)
    if carried:
        shape = tuple(int(d) for d in carried["input_shape"])
        return str(meta.model_uuid or ""), shape, len(carried["labels"])
    signature = meta.signature
    shapes = None
    if signature is not None and signature.inputs is not None and signature.outputs is not None:
        inputs, outputs = signature.inputs.inputs, signature.outputs.inputs
        if len(inputs) == 1 and len(outputs) == 1 and hasattr(inputs[0], "shape"):
            shapes = (tuple(inputs[0].shape), tuple(outputs[0].shape))
    if shapes is None:
        import mlflow.tensorflow

        keras_model = mlflow.tensorflow.load_model(local_dir)
        shapes = (tuple(keras_model.input_shape), tuple(keras_model.output_shape))
    (input_shape, output_shape) = shapes
    dims = tuple(None if d is None or d < 0 else int(d) for d in input_shape[1:])
    outputs = output_shape[-1]
    if len(output_shape) != 2 or outputs is None or outputs < 1:
        raise ValueError(
            f"the model at {local_dir} outputs shape {output_shape}: expected (batch, classes)"
        )
    return str(meta.model_uuid or ""), dims, int(outputs)


def local_model(local_dir: str, name: str, version: str, labels: list[str]) -> ScoringModel:
    """A ScoringModel for a model saved with ``mlflow.tensorflow.save_model`` (no registry)."""
    model_uuid, input_shape, outputs = describe(local_dir)
    model = ScoringModel(
        name, version, "", model_uuid, input_shape, outputs, tuple(labels), local_dir
    )
    check_labels(model)
    return model


# --- checks against the data, before any Spark work ------------------------------------------


def check_labels(model: ScoringModel) -> None:
    if len(model.labels) != model.num_outputs:
        raise ValueError(
            f"model {model.uri} outputs {model.num_outputs} class probabilities but the label "
            f"map of its training run has {len(model.labels)} classes "
            f"({', '.join(model.labels[:12])}{', ...' if len(model.labels) > 12 else ''}): "
            "the model and its dataset/labels.json do not belong together; register the model "
            "from the run that trained it"
        )


def image_settings(
    model: ScoringModel,
    image_size: tuple[int, int] | None = None,
    color_mode: str | None = None,
    stored_shape: tuple[int, ...] | None = None,
) -> tuple[tuple[int, int], str]:
    """(image_size, color_mode) the inputs are decoded to: the model's input, checked against
    what was asked and what a dataset holds (``stored_shape``, e.g. (224, 224, 3))."""
    shape = model.input_shape
    if len(shape) != 3 or shape[2] not in CHANNELS:
        raise ValueError(
            f"model {model.uri} takes inputs of shape {shape}: expected images (height, "
            "width, 1 or 3 channels)"
        )
    height, width, channels = shape
    model_mode = CHANNELS[channels]
    if color_mode is not None and color_mode != model_mode:
        raise ValueError(
            f"color_mode {color_mode!r} does not fit model {model.uri}, which takes "
            f"{channels}-channel images ({model_mode!r}): use color_mode {model_mode!r}"
        )
    if (
        image_size is not None
        and None not in (height, width)
        and tuple(image_size) != (height, width)
    ):
        raise ValueError(
            f"image_size {tuple(image_size)} does not fit model {model.uri}, which takes "
            f"{height}x{width} images: use image_size [{height}, {width}] or leave it unset"
        )
    size = (height, width) if None not in (height, width) else image_size
    if stored_shape is not None:
        stored = tuple(stored_shape)
        stored_size, stored_mode = stored[:2], CHANNELS.get(stored[2] if len(stored) == 3 else 1)
        if (size is not None and stored_size != tuple(size)) or stored_mode != model_mode:
            raise ValueError(
                f"the dataset holds images of shape {stored} but model {model.uri} takes "
                f"{shape} (height, width, channels): score the raw images instead "
                "(input_format 'images' resizes them), or a dataset preprocessed for this model"
            )
        size = stored_size
    if size is None:
        raise ValueError(
            f"model {model.uri} accepts images of any size {shape}: give image_size "
            "(height, width) to resize the inputs to"
        )
    return (int(size[0]), int(size[1])), model_mode
