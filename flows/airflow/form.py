"""The trigger form of the pipeline DAG: its fields and the pipeline parameters they set.

Both halves read this (the DAG's ``params`` in Airflow's environment, the validation in
hvdflow's), so it imports nothing but the standard library. The fields are the command line's
flags (``hvdflow run --np 2 --epochs 3``); ``params`` takes any other parameter as nested JSON,
as ``--params`` does, and the fields win over it.
"""

from __future__ import annotations

# Form field -> the pipeline parameter it sets (flows.params.PipelineParams, dotted).
PIPELINE_FIELDS = {
    "np": "launcher.np",
    "epochs": "training.epochs",
    "model": "training.model",
    "framework": "training.framework",
    "input": "data.input",
    "input_format": "data.input_format",
    "spark_master": "launcher.spark_master",
}
# The field of nested JSON: every other parameter, as `hvdflow run --params` takes it.
NESTED_FIELD = "params"

# What the form says of each field (Airflow shows it under the field).
DESCRIPTIONS = {
    "np": "ranks; negative: that many on the driver, without Spark (default 2)",
    "epochs": "epochs to train (empty: the pipeline's default)",
    "model": "digits_mlp, mnist_cnn, vgg16, inceptionv3 (empty: the pipeline's default)",
    "framework": "tensorflow or torch (empty: tensorflow)",
    "input": "the images: a folder of class sub-folders, MNIST IDX files, or s3://bucket/prefix "
    "(empty: the bundled digits)",
    "input_format": "folders, mnist_idx or digits (empty: digits, the bundled set)",
    "spark_master": "the Spark master URL, or a Spark Connect URL sc://host:15002 (empty: "
    "$HVDFLOW_SPARK_MASTER, else $SPARK_REMOTE, else local[N])",
    NESTED_FIELD: 'any other parameter as nested JSON, e.g. {"training": {"batch_size": 64}}',
}


def nested_values(conf: dict) -> dict:
    """The pipeline's nested parameters from a DAG run's params: ``params`` with the fields on
    top (an empty field leaves the pipeline's default). ValueError for a ``params`` that is not
    a JSON object."""
    nested = conf.get(NESTED_FIELD) or {}
    if not isinstance(nested, dict):
        raise ValueError(f"params must be a JSON object, not {nested!r}")
    values = {
        key: dict(value) if isinstance(value, dict) else value for key, value in nested.items()
    }
    for field, dotted in PIPELINE_FIELDS.items():
        value = conf.get(field)
        if value is None or value == "":
            continue
        *parents, leaf = dotted.split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return values
