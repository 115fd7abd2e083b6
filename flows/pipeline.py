"""The end-to-end pipeline flow: preprocess, stage weights, train with HorovodRunner, track.

Runs from the command line (``hvdflow run``), on a schedule or from the Prefect UI
(``hvdflow serve``). Its defaults run on the embedded services with the bundled digits.
"""

from __future__ import annotations

from typing import Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict, Field

from infra.horovod_options import HorovodOptions
from infra.services import hvdflow_home
from infra.tracking import tracking_uri
from tasks.preprocess import PreprocessConfig
from tasks.stage_weights import OFFLINE_SOURCE
from tasks.steps import check_tracking_step, preprocess_step, stage_weights_for, train_step
from tasks.train import TrainConfig


def preprocess_config_for(params, **extra) -> PreprocessConfig:
    """The preprocessing config of a flow's parameters; empty paths mean HVDFLOW_HOME's."""
    home = hvdflow_home()
    return PreprocessConfig(
        input=params.input or str(home / "data" / "digits"),
        input_format=params.input_format,
        output=params.output or str(home / "datasets"),
        image_size=params.image_size,
        color_mode=params.color_mode,
        seed=params.seed,
        **extra,
    )


class PipelineParams(BaseModel):
    """Everything one pipeline run needs; the defaults train on the bundled digits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str = Field(default="", description="image folder or MNIST IDX folder; empty: digits")
    input_format: Literal["folders", "mnist_idx", "digits"] = "digits"
    output: str = Field(default="", description="dataset root (path or s3://); empty: HVDFLOW_HOME")
    image_size: tuple[int, int] = (8, 8)
    color_mode: Literal["L", "RGB"] = "L"
    val_fraction: float = 0.2
    max_bad_fraction: float = 0.1
    model: str = "digits_mlp"
    weights_source: str = Field(
        default=OFFLINE_SOURCE, description="http(s) URL, file, or keras:weights=None; '' = none"
    )
    np: int = 2
    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 0.01
    optimizer: str = "adam"
    seed: int = 0
    experiment: str = "hvdflow"
    registered_model_name: str = "hvdflow-digits"
    horovod: HorovodOptions = HorovodOptions()
    spark_master: str | None = None

    def preprocess_config(self) -> PreprocessConfig:
        return preprocess_config_for(
            self, val_fraction=self.val_fraction, max_bad_fraction=self.max_bad_fraction
        )

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            model=self.model,
            np=self.np,
            epochs=self.epochs,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            optimizer=self.optimizer,
            seed=self.seed,
            experiment=self.experiment,
            registered_model_name=self.registered_model_name,
            horovod=self.horovod,
        )


DEFAULT_PARAMS = PipelineParams()


@flow(name="hvdflow-pipeline", log_prints=True)
def pipeline(params: PipelineParams = DEFAULT_PARAMS) -> dict:
    """Preprocess images, stage weights, train with Horovod on Spark, log and register."""
    logger = get_run_logger()
    uri = tracking_uri()
    check_tracking_step(uri)
    dataset = preprocess_step(params.preprocess_config(), params.spark_master)
    weights = None
    if params.weights_source:
        weights = stage_weights_for(params.model, params.weights_source, dataset)
    result = train_step(params.train_config(), dataset, weights, uri, params.spark_master)
    summary = _summary(params, dataset, weights, result)
    _publish_artifacts(summary, result)
    logger.info(
        "done: MLflow run %s, model version %s", summary["mlflow_run_url"], summary["model"]
    )
    return summary


def _summary(params, dataset, weights, result) -> dict:
    base = result.tracking_uri.rstrip("/")
    http = base.startswith("http")
    name = params.registered_model_name
    return {
        "flow_run_id": str(flow_run.get_id()) if flow_run.get_id() else None,
        "dataset": dataset.path,
        "train_rows": dataset.train_rows,
        "val_rows": dataset.val_rows,
        "quarantined": dataset.quarantined,
        "weights_uri": weights.uri if weights else None,
        "mlflow_run_id": result.run_id,
        "mlflow_run_url": f"{base}/#/experiments/{result.experiment_id}/runs/{result.run_id}"
        if http
        else result.run_id,
        "model": f"models:/{name}/{result.model_version}",
        "model_url": f"{base}/#/models/{name}/versions/{result.model_version}" if http else None,
        "aliases": result.aliases,
        "images_per_s": round(result.images_per_s, 1),
        "wall_clock_s": round(result.wall_clock_s, 1),
        "val_accuracy": result.history.get("val_accuracy", [None])[-1],
    }


def _publish_artifacts(summary: dict, result) -> None:
    rows = []
    for epoch, seconds in enumerate(result.epoch_times):
        log_s = result.epoch_times_log[epoch] if epoch < len(result.epoch_times_log) else None
        rows.append(
            {
                "epoch": epoch + 1,
                "epoch_time_s (callback)": round(seconds, 3),
                "epoch_time_s (log method)": round(log_s, 3) if log_s is not None else "",
                "val_accuracy": round(result.history.get("val_accuracy", [0] * 99)[epoch], 4),
            }
        )
    create_table_artifact(rows, key="hvdflow-timings", description="Epoch times and accuracy")
    model_link = summary["model_url"] or summary["model"]
    create_markdown_artifact(
        key="hvdflow-summary",
        description="Where the results are",
        markdown="\n".join(
            [
                "# hvdflow pipeline run",
                f"- MLflow run: [{summary['mlflow_run_id']}]({summary['mlflow_run_url']})",
                f"- Registered model: [{summary['model']}]({model_link}), aliases "
                f"{', '.join(summary['aliases']) or 'none'}",
                f"- Dataset: `{summary['dataset']}` ({summary['train_rows']} train, "
                f"{summary['val_rows']} val)",
                f"- Quarantined inputs: **{summary['quarantined']}**",
                f"- Throughput: {summary['images_per_s']} images/s, wall-clock "
                f"{summary['wall_clock_s']} s",
            ]
        ),
    )
