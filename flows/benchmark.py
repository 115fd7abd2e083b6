"""The benchmark flow: the paper's study (Pan, Liu, Zhou, AAAI DLGMA 2020) on your cluster.

For one model and dataset it sweeps conditions (a plain single-process Keras baseline, then
np = 1, 2, ...), repetitions and epochs, and reports epoch times by two methods, images/s,
scaling efficiency against np=1, one-way ANOVA and Tukey HSD, as a table and plots, in MLflow
and as Prefect artifacts. Repetitions are interleaved (every condition once per round) so that
drift in the machine's state spreads over all conditions.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, ConfigDict, Field

from flows.pipeline import preprocess_config_for
from infra.services import hvdflow_home
from infra.tracking import tracking_uri
from tasks.preprocess import PreprocessConfig
from tasks.steps import check_tracking_step, preprocess_step


class BenchParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "mnist_cnn"
    input: str = Field(default="", description="image folder or IDX folder; empty: digits")
    input_format: Literal["folders", "mnist_idx", "digits"] = "digits"
    output: str = ""
    image_size: tuple[int, int] = (28, 28)
    color_mode: Literal["L", "RGB"] = "L"
    conditions: list[str] = ["keras", "1", "2"]
    repetitions: int = Field(default=3, ge=1)
    epochs: int = Field(default=3, ge=1)
    batch_size: int = 64
    learning_rate: float = 1.0  # Adadelta's customary rate, as in the Databricks MNIST example
    optimizer: str = "adadelta"
    seed: int = 0
    weights_source: str = Field(
        default="",
        description="weights staged once to the object store and loaded by every rank "
        "(URL, file, or keras:weights=None); '' = train from scratch",
    )
    experiment: str = "hvdflow-benchmark"
    spark_master: str | None = None

    def preprocess_config(self) -> PreprocessConfig:
        return preprocess_config_for(self)


DEFAULT_BENCH = BenchParams()


@task(name="bench-condition")
def measure_step(
    condition: str, repetition: int, train_kwargs: dict, spark_master: str | None, trainer: str
):
    from bench.conditions import measure
    from infra.spark import get_spark

    m = measure(condition, repetition, train_kwargs, get_spark(spark_master), trainer)
    get_run_logger().info(
        "%s round %d: %.1f images/s, epochs %s s",
        m.condition,
        repetition + 1,
        m.images_per_s,
        [round(t, 2) for t in m.epoch_times],
    )
    return m


@flow(name="hvdflow-benchmark")
def benchmark(params: BenchParams = DEFAULT_BENCH) -> dict:
    logger = get_run_logger()
    uri = tracking_uri()
    check_tracking_step(uri)
    if params.model == "gcn":
        trainer, train_kwargs, dataset_info = "gcn", *_graph_inputs(params)
    else:
        trainer = "classifier"
        train_kwargs, dataset_info = _image_inputs(params)
    measurements = []
    for repetition in range(params.repetitions):
        for condition in params.conditions:
            measurements.append(
                measure_step(condition, repetition, train_kwargs, params.spark_master, trainer)
            )
    return _report(params, measurements, dataset_info, uri, logger)


def _graph_inputs(params: BenchParams) -> tuple[dict, dict]:
    """Cora-format files: ``input`` is their common prefix (``.../cora`` for cora.content);
    empty: Zachary's karate club from networkx."""
    from training.gcn import write_karate_cora

    if params.input:
        content, cites = f"{params.input}.content", f"{params.input}.cites"
    else:
        content, cites = write_karate_cora(str(hvdflow_home() / "data" / "karate"))
    kwargs = {
        "content_path": content,
        "cites_path": cites,
        "epochs": params.epochs,
        "learning_rate": params.learning_rate,
        "seed": params.seed,
    }
    return kwargs, {"dataset": content, "train_rows": None}


def _image_inputs(params: BenchParams) -> tuple[dict, dict]:
    dataset = preprocess_step(params.preprocess_config(), params.spark_master)
    train_kwargs = {
        "train_url": dataset.train_url,
        "val_url": dataset.val_url,
        "train_rows": dataset.train_rows,
        "val_rows": dataset.val_rows,
        "num_classes": dataset.num_classes,
        "input_shape": list(dataset.image_shape),
        "model_name": params.model,
        "epochs": params.epochs,
        "batch_size": params.batch_size,
        "learning_rate": params.learning_rate,
        "optimizer": params.optimizer,
        "seed": params.seed,
    }
    if params.weights_source:
        # As in the paper's fix for "too many requests": fetch once, ranks read the bucket.
        from tasks.steps import stage_weights_for

        staged = stage_weights_for(params.model, params.weights_source, dataset)
        train_kwargs |= {"weights_uri": staged.uri, "weights_sha256": staged.sha256}
    return train_kwargs, {"dataset": dataset.fingerprint, "train_rows": dataset.train_rows}


def _report(params: BenchParams, measurements, dataset_info: dict, uri: str, logger) -> dict:
    import mlflow

    from bench import stats

    rows = stats.summary_table(measurements)
    anova = stats.anova(measurements)
    table = stats.markdown(rows, anova)
    out_dir = Path(tempfile.mkdtemp(prefix="hvdflow-bench-"))
    plots = stats.plot(rows, out_dir, params.model)
    (out_dir / "table.md").write_text(table + "\n")
    (out_dir / "measurements.json").write_text(
        json.dumps([{**m.__dict__} for m in measurements], indent=2)
    )

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(params.experiment)
    with mlflow.start_run(run_name=f"bench-{params.model}") as run:
        mlflow.log_params(
            {k: v for k, v in params.model_dump().items() if k not in ("input", "output")}
            | {"dataset": dataset_info["dataset"], "train_rows": dataset_info["train_rows"]}
        )
        for row in rows:
            tag = row["condition"].replace("=", "")
            mlflow.log_metric(f"{tag}_images_per_s", row["images_per_s"])
            mlflow.log_metric(f"{tag}_epoch_time_mean_s", row["epoch_time_mean_s"])
            if row["scaling_efficiency"] is not None:
                mlflow.log_metric(f"{tag}_scaling_efficiency", row["scaling_efficiency"])
        if anova:
            mlflow.log_metrics({"anova_f": anova[0], "anova_p": anova[1]})
        for path in [*plots, out_dir / "table.md", out_dir / "measurements.json"]:
            mlflow.log_artifact(str(path), "benchmark")

    create_table_artifact(
        [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
        key="hvdflow-benchmark-table",
        description=f"{params.model}: epoch times, Tukey p against np=1, images/s, scaling",
    )
    create_markdown_artifact(
        key="hvdflow-benchmark-summary",
        markdown=f"# {params.model} benchmark\n\n{table}\n\nPlots (images/s, scaling "
        f"efficiency) are artifacts of MLflow run `{run.info.run_id}` under `benchmark/`.",
    )
    logger.info("benchmark table:\n%s", table)
    return {
        "rows": rows,
        "anova": anova,
        "table": table,
        "plots": [str(p) for p in plots],
        "mlflow_run_id": run.info.run_id,
    }
