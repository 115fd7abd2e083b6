"""The benchmark flow: the paper's study (Pan, Liu, Zhou, AAAI DLGMA 2020) on your cluster.

For one model and dataset it sweeps conditions (a plain single-process Keras baseline, then
np = 1, 2, ...), repetitions and epochs, and reports epoch times by two methods, images/s,
scaling efficiency against np=1, one-way ANOVA and Tukey HSD, as a table and plots, in MLflow
and as Prefect artifacts. Repetitions are interleaved (every condition once per round) so that
drift in the machine's state spreads over all conditions.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from hvdflow.bench import stats, time_to_target
from hvdflow.bench.conditions import dataset_readers, measure
from hvdflow.bench.workloads import write_augmented_digits_idx
from hvdflow.flows.params import AUGMENTED_DIGITS, BenchParams
from hvdflow.flows.prefect.orphan import outlive_worker
from hvdflow.flows.prefect.preprocess import preprocessed
from hvdflow.flows.prefect.results import shared_result_storage
from hvdflow.flows.prefect.spark_slots import spark_slots
from hvdflow.flows.prefect.train import check_tracking_step
from hvdflow.flows.prefect.weights import stage_weights_for
from hvdflow.infra.home import hvdflow_home
from hvdflow.infra.secrets import redact_url, tracking_login
from hvdflow.infra.spark import get_spark
from hvdflow.infra.tracking import tracking_uri
from hvdflow.tasks.config import GRAPH_MODELS, LauncherParams
from hvdflow.tasks.train.spec import training_spec
from hvdflow.tasks.weights.stage import redact
from hvdflow.training.gcn import write_karate_cora

DEFAULT_BENCH = BenchParams()


@task(name="bench-condition")
def measure_step(
    condition: str,
    repetition: int,
    train_kwargs: dict,
    launcher: LauncherParams,
    trainer: str,
    threads_per_rank: int = 1,
):
    spark = get_spark(launcher.spark_master)
    logger = get_run_logger()
    # Timings that share the cluster with another flow measure that flow too: the whole of it.
    with spark_slots(spark, None, f"benchmark condition {condition}", logger):
        options = launcher.launch_options(spark=spark)
        m = measure(condition, repetition, train_kwargs, trainer, options, threads_per_rank)
    logger.info(
        "%s round %d: %.1f images/s steady (warm-up epoch %.1f s, launch %.1f s), epochs %s s",
        m.condition,
        repetition + 1,
        m.steady_images_per_s,
        m.warmup_s,
        m.launch_s,
        [round(t, 2) for t in m.epoch_times],
    )
    return m


@flow(name="hvdflow-benchmark")
def benchmark(params: BenchParams = DEFAULT_BENCH) -> dict:
    outlive_worker()  # a run orphaned by its worker's death goes on, and leaves nothing
    logger = get_run_logger()
    # A user:password in the tracking URI goes to MLflow's login variables for the run: no task
    # input, result or printed link carries it.
    with tracking_login(tracking_uri()) as uri:
        check_tracking_step(uri)
        if params.training.model == "gcn":
            trainer, train_kwargs, dataset_info = "gcn", *_graph_inputs(params)
        else:
            trainer = "classifier"
            train_kwargs, dataset_info = _image_inputs(params)
        measurements = []
        for repetition in range(params.repetitions):
            for condition in params.conditions:
                measurements.append(
                    measure_step(
                        condition,
                        repetition,
                        train_kwargs,
                        params.launcher,
                        trainer,
                        params.threads_per_rank,
                    )
                )
        return _report(params, measurements, dataset_info, uri, logger)


def _graph_inputs(params: BenchParams) -> tuple[dict, dict]:
    """Cora-format files: ``input`` is their common prefix (``.../cora`` for cora.content);
    empty: Zachary's karate club from networkx."""
    if params.data.input:
        content, cites = f"{params.data.input}.content", f"{params.data.input}.cites"
    else:
        content, cites = write_karate_cora(str(hvdflow_home() / "data" / "karate"))
    kwargs = {
        "content_path": content,
        "cites_path": cites,
        "epochs": params.training.epochs,
        "learning_rate": params.training.learning_rate,
        "seed": params.training.seed,
    }
    return kwargs, {"dataset": content, "train_rows": None}


def _image_inputs(params: BenchParams) -> tuple[dict, dict]:
    training = params.training
    data_params = params.data
    if params.workload == AUGMENTED_DIGITS and not data_params.input:
        root = hvdflow_home() / "data" / f"digits-augmented-{params.images}"
        write_augmented_digits_idx(str(root), params.images, data_params.val_fraction)
        data_params = data_params.model_copy(
            update={"input": str(root), "input_format": "mnist_idx"}
        )
    data = data_params.preprocess_config(ranks=dataset_readers(params.conditions))
    storage = shared_result_storage()  # reruns on any worker reuse the dataset and weights
    dataset = preprocessed(data, params.launcher.spark_master, storage)
    staged = None
    if training.weights_source:
        # As in the paper's fix for "too many requests": fetch once, ranks read the bucket.

        staged = stage_weights_for(
            training.model,
            training.weights_source,
            dataset,
            storage,
            spark_master=params.launcher.spark_master,
        )
    # The study times every condition to its end and reports the accuracy it reached: no
    # condition stops early or is judged (and nothing is registered).
    spec = training_spec(training, dataset, staged).replace(chance_margin=None)
    train_kwargs = {
        "spec": spec.to_dict()
    }  # plain values: a Prefect task input, the baseline's JSON
    workload = (
        f"the bundled digits augmented to {params.images} 28x28 images (shifts, small rotations, "
        "noise)"
        if data_params is not params.data
        else f"{params.data.input_format} {redact(params.data.input) or 'bundled digits'}"
    )
    return train_kwargs, {
        "dataset": dataset.fingerprint,
        "train_rows": dataset.train_rows,
        "workload": workload,
    }


def _report(params: BenchParams, measurements, dataset_info: dict, uri: str, logger) -> dict:
    import mlflow  # noqa: PLC0415 (lazy: it loads MLflow)

    target = params.target_accuracy
    rows = stats.summary_table(measurements, target=target)
    anova = stats.anova(measurements)
    anova_time = stats.anova(measurements, stats.times_to_target(measurements, target))
    reference = stats.reference_of(measurements)
    table = stats.markdown(rows, anova, anova_time, reference)
    per_round = time_to_target.rows(measurements, target, reference, stats.order(measurements))
    table += f"\n\n{_interval_note(params.training)}\n\n" + time_to_target.markdown(
        per_round, target, reference
    )
    model = params.training.model
    # The plots and tables stay where the result points, beside the other runs' (not in /tmp).
    out_dir = hvdflow_home() / "benchmarks" / f"{time.strftime('%Y%m%d-%H%M%S')}-{model}"
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = stats.plot(rows, out_dir, model)
    curves = time_to_target.plot_curves(measurements, out_dir, model, target)
    plots += [curves] if curves else []
    (out_dir / "table.md").write_text(table + "\n")
    (out_dir / "measurements.json").write_text(
        json.dumps([{**m.__dict__} for m in measurements], indent=2)
    )

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(params.experiment)
    with mlflow.start_run(run_name=f"bench-{model}") as run:
        mlflow.log_params(_bench_params(params) | dataset_info)
        for row in rows:
            tag = row["condition"]
            for key in ("images_per_s", "epoch_time_mean_s", "warmup_s", "launch_s"):
                mlflow.log_metric(f"{tag}_{key}", row[key])
            for key in (
                "scaling_efficiency",
                "of_ceiling",
                "vs_keras",
                "vs_keras1",
                "val_accuracy",
                "time_to_target_s",
            ):
                if row[key] is not None:
                    mlflow.log_metric(f"{tag}_{key}", row[key])
        _log_evaluations(run.info.run_id, measurements)
        if anova:
            mlflow.log_metrics({"anova_f": anova[0], "anova_p": anova[1]})
        if anova_time:
            mlflow.log_metrics({"anova_time_f": anova_time[0], "anova_time_p": anova_time[1]})
        for path in [*plots, out_dir / "table.md", out_dir / "measurements.json"]:
            mlflow.log_artifact(str(path), "benchmark")

    create_table_artifact(
        [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
        key="hvdflow-benchmark-table",
        description=f"{model}: epoch times, Tukey p against np=1, images/s, scaling",
    )
    run_link = _run_link(uri, run.info.experiment_id, run.info.run_id)
    create_markdown_artifact(
        key="hvdflow-benchmark-summary",
        description=f"{model}: table and plots",
        markdown=f"# {model} benchmark\n\n{table}\n\n{plots_markdown(plots)}\n\nThe plots, "
        f"table and measurements are artifacts of MLflow run {run_link} under `benchmark/`.",
    )
    logger.info("benchmark table:\n%s", table)
    return {
        "rows": rows,
        "time_to_target": per_round,
        "anova": anova,
        "anova_time_to_target": anova_time,
        "table": table,
        "plots": [str(p) for p in plots],
        "mlflow_run_id": run.info.run_id,
        "dataset": dataset_info,
    }


def _log_evaluations(run_id: str, measurements) -> None:
    """Every round's interval evaluations into the run's charts, a batch at a time."""
    from mlflow import MlflowClient  # noqa: PLC0415 (lazy: it loads MLflow)
    from mlflow.entities import Metric  # noqa: PLC0415

    now = int(time.time() * 1000)
    metrics = [
        Metric(key, value, now, step)
        for key, value, step in time_to_target.evaluation_metrics(measurements)
    ]
    client = MlflowClient()
    for start in range(0, len(metrics), 1000):  # MLflow's limit per batch
        client.log_batch(run_id, metrics=metrics[start : start + 1000])


def _interval_note(training) -> str:
    """How the table below read the time to the target: every few steps, or at epoch ends."""
    if training.eval_every > 0 and training.model not in GRAPH_MODELS:
        return (
            f"Time to target: the first evaluation that reached it, launch and evaluations "
            f"included; a fixed subset of up to {training.eval_images} validation images "
            f"evaluated every {training.eval_every:g} of an epoch and at its end, split among "
            "the ranks. Round r trains with seed + r - 1 in every condition (MLPerf's rule); "
            "the trimmed mean drops the fastest and the slowest round."
        )
    return (
        "Time to target: the end of the first epoch whose val_accuracy reached it. Round r "
        "trains with seed + r - 1 in every condition; the trimmed mean drops the fastest and "
        "the slowest round."
    )


def plots_markdown(paths: list[Path]) -> str:
    """The PNG plots as Markdown images, embedded as ``data:`` URIs: Prefect's UI shows them in
    the flow run's artifacts with nothing else to reach (no login to the tracking server, no
    server that must still be up, the same on every host)."""
    images = []
    for path in paths:
        encoded = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        title = Path(path).stem.replace("_", " ")
        images.append(f"![{title}](data:image/png;base64,{encoded})")
    return "\n\n".join(images)


def _run_link(uri: str, experiment_id: str, run_id: str) -> str:
    """A Markdown link to the MLflow run's page, or its id where the store has no web UI."""
    base = redact_url(uri).rstrip("/")
    if not base.startswith(("http://", "https://")):
        return f"`{run_id}`"
    return f"[`{run_id}`]({base}/#/experiments/{experiment_id}/runs/{run_id})"


def _bench_params(params: BenchParams) -> dict:
    """What MLflow records of the study: the training settings and the design, no paths."""
    training = params.training.model_dump(exclude={"weights_source"})
    horovod = params.launcher.horovod
    return {
        **training,
        "weights_source": redact(params.training.weights_source) or "none",
        "image_size": params.data.image_size,
        "color_mode": params.data.color_mode,
        "conditions": ",".join(params.conditions),
        "repetitions": params.repetitions,
        "target_accuracy": params.target_accuracy,
        # Horovod's knobs, but never extra_env: it may carry secrets.
        **{f"horovod_{k}": v for k, v in horovod.model_dump(exclude={"extra_env"}).items()},
    }
