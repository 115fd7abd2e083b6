"""What the ``hvdflow`` command line accepts: its commands, their flags and their help texts.

One function per command, or per group of commands that share their flags (the services; the
pipeline's run, serve and deploy). What each command does comes from ``hvdflow.flows.cli``,
by command name (``build_parser(handlers)``), so this module imports nothing of hvdflow and
``hvdflow --help`` answers at once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

# A command's function: the parsed command line in, the exit code out.
Handler = Callable[[argparse.Namespace], int]
Commands = argparse._SubParsersAction


def build_parser(handlers: Mapping[str, Handler]) -> argparse.ArgumentParser:
    """The ``hvdflow`` parser; a command's parsed arguments carry its handler as ``func``."""
    parser = argparse.ArgumentParser(
        prog="hvdflow",
        description="Spark-to-deep-learning pipelines: preprocessing, barrier-mode Horovod "
        "training on Spark, MLflow tracking, on Prefect.",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks instead of one-line errors"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In the order `hvdflow --help` lists them.
    for add in (
        _add_smoke,
        _add_services,
        _add_pipeline_commands,
        _add_score,
        _add_bench,
        _add_bench_input,
    ):
        add(commands, handlers)
    return parser


def _add_smoke(commands: Commands, handlers: Mapping[str, Handler]) -> None:
    smoke = commands.add_parser(
        "smoke",
        help="train a small model on the bundled digits with HorovodRunner and check that "
        "every rank ends with identical weights",
        description="Train a small model on the bundled digits with HorovodRunner; exits 1 "
        "unless every rank ends with identical weights. The Spark master comes from "
        "$HVDFLOW_SPARK_MASTER (default local[N]).",
    )
    smoke.add_argument("--np", type=int, default=2, help="ranks (negative: on the driver)")
    smoke.add_argument("--epochs", type=int, default=2)
    smoke.add_argument(
        "--driver-log-verbosity", default="all", choices=["all", "log_callback_only"]
    )
    smoke.set_defaults(func=handlers["smoke"])


def _add_services(commands: Commands, handlers: Mapping[str, Handler]) -> None:
    """up, down and status: the embedded services and what ran on them."""
    up = commands.add_parser(
        "up",
        help="start the embedded object store, MLflow server and Prefect server (UI)",
        description="Start SeaweedFS (S3), the MLflow tracking server and the Prefect server on "
        "127.0.0.1 (or --bind), keeping data in $HVDFLOW_HOME (default ~/.hvdflow). Services "
        "the environment already points elsewhere (AWS_ENDPOINT_URL, MLFLOW_TRACKING_URI, "
        "PREFECT_API_URL) are not started. The object store always checks its access keys; "
        "bound beyond loopback, MLflow requires a login and Prefect its auth string too. "
        "Credentials are generated at the first start and kept in files only you can read.",
    )
    up.add_argument("--no-prefect", action="store_true", help="skip the Prefect server")
    up.add_argument(
        "--bind",
        metavar="ADDRESS",
        help="the address all of them listen on and their URLs name, e.g. this machine's "
        "address that Spark executors on other hosts reach (default: 127.0.0.1, or that of "
        "the services already running)",
    )
    up.set_defaults(func=handlers["up"])

    down = commands.add_parser("down", help="stop the services `hvdflow up` started")
    down.set_defaults(func=handlers["down"])

    status = commands.add_parser(
        "status",
        help="the services (up or down, URLs) and the last runs (state, model version, aliases)",
        description="Show whether the object store, MLflow and Prefect answer, and where; the "
        "last runs of the pipeline's MLflow experiment with their state, registered version, "
        "aliases (champion, candidate) and Prefect flow run state. Starts nothing.",
    )
    status.add_argument("--model", help="registered model name (default: hvdflow-classifier)")
    status.add_argument("--experiment", help="MLflow experiment (default: hvdflow)")
    status.add_argument("--last", type=int, default=5, help="how many runs (default 5)")
    status.set_defaults(func=handlers["status"])


def _add_pipeline_commands(commands: Commands, handlers: Mapping[str, Handler]) -> None:
    """run, serve and deploy: the pipeline's parameters, then each one's own flags."""
    run = _pipeline_command(
        commands, "run", "run the pipeline once (starts the services if needed)", handlers
    )
    run.add_argument(
        "--resume",
        nargs="?",
        const="last",
        metavar="RUN_ID",
        help="continue a training that failed for good, in its MLflow run, from its last "
        "checkpoint: the experiment's newest failed run, or RUN_ID",
    )

    serve = _pipeline_command(
        commands, "serve", "serve the pipeline as a scheduled Prefect deployment", handlers
    )
    _add_schedules(serve)

    deploy = _pipeline_command(
        commands,
        "deploy",
        "register the pipeline, benchmark and scoring deployments with a work pool "
        "(module entrypoints: workers need hvdflow installed, not a checkout)",
        handlers,
    )
    _add_schedules(deploy)
    deploy.add_argument(
        "--pool", required=True, help="the work pool (created if none: process, or docker)"
    )
    deploy.add_argument(
        "--image",
        help="a Docker work pool: each flow run in a container of IMAGE (make image; a "
        "`prefect worker start --type docker` worker needs hvdflow[docker])",
    )
    deploy.add_argument(
        "--network", help="with --image: the containers' Docker network ('host': the host's)"
    )
    deploy.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --image: a variable for the containers, beside the services' (AWS_*, "
        "MLFLOW_*); secret ones go by reference to Prefect Secret blocks",
    )
    deploy.add_argument(
        "--score-input",
        help="what the scoring deployment scores by default: a folder or s3://bucket/prefix",
    )
    deploy.add_argument("--score-cron", help="scoring schedule (default: none)")
    deploy.add_argument(
        "--score-on-champion",
        action="store_true",
        help="score --score-input with each new champion (a Prefect trigger on the "
        "hvdflow.model.champion-moved event)",
    )


def _pipeline_command(
    commands: Commands, name: str, help_text: str, handlers: Mapping[str, Handler]
) -> argparse.ArgumentParser:
    """A command that takes the pipeline's parameters (``hvdflow.flows.cli.PIPELINE_FLAGS``)."""
    command = commands.add_parser(name, help=help_text, description=help_text)
    command.add_argument("--np", type=int, help="ranks (default 2; negative: on the driver)")
    command.add_argument("--epochs", type=int)
    command.add_argument("--input", help="image folder (class sub-folders) or IDX folder")
    command.add_argument("--input-format", choices=["folders", "mnist_idx", "digits"])
    command.add_argument("--output", help="dataset root: a path or s3://bucket/prefix")
    command.add_argument("--model", help="digits_mlp, mnist_cnn, vgg16, inceptionv3")
    command.add_argument(
        "--framework",
        choices=["tensorflow", "torch"],
        help="what trains the model (default tensorflow; torch needs hvdflow[torch])",
    )
    command.add_argument(
        "--spark-master",
        help="a master or a Spark Connect URL (sc://host:15002); default: "
        "$HVDFLOW_SPARK_MASTER, else $SPARK_REMOTE, else local[N]",
    )
    command.add_argument(
        "--params",
        help='pipeline parameters as nested JSON, e.g. \'{"training": {"optimizer": '
        '"sgd"}, "launcher": {"horovod": {"cycle_time_ms": 10}}}\'; flags win',
    )
    command.set_defaults(func=handlers[name])
    return command


def _add_schedules(command: argparse.ArgumentParser) -> None:
    """The pipeline's and the benchmark's schedules (serve, deploy)."""
    command.add_argument(
        "--cron",
        default="0 3 * * *",
        help="pipeline schedule (default: daily, 03:00; '' for none)",
    )
    command.add_argument(
        "--bench-cron",
        default="0 4 * * 0",
        help="benchmark schedule (default: Sundays, 04:00; '' for none)",
    )


def _add_score(commands: Commands, handlers: Mapping[str, Handler]) -> None:
    score = commands.add_parser(
        "score",
        help="score images with a registered model on Spark (default: its champion)",
        description="Predict a class for every image in a folder or s3:// prefix (decoded and "
        "resized as preprocessing does; unreadable files are quarantined), or in a Parquet "
        "dataset, with models:/NAME@ALIAS or models:/NAME/VERSION loaded once per Spark "
        "executor process. Writes Parquet (source, class_name, class_index, probability) and "
        "records the model version used in MLflow (starts the services if needed).",
    )
    score.add_argument("--input", help="folder or s3://bucket/prefix of images, or a dataset")
    score.add_argument("--input-format", choices=["images", "dataset"])
    score.add_argument(
        "--output", help="a path or s3://bucket/prefix (default: under $HVDFLOW_HOME/scores)"
    )
    score.add_argument("--model", help="registered model name (default: hvdflow-classifier)")
    score.add_argument("--alias", help="registry alias (default: champion)")
    score.add_argument("--version", help="registry version number, instead of an alias")
    score.add_argument("--batch-size", type=int, help="images per predict call (default 64)")
    score.add_argument(
        "--spark-master",
        help="a master or a Spark Connect URL (sc://host:15002); default: "
        "$HVDFLOW_SPARK_MASTER, else $SPARK_REMOTE, else local[N]",
    )
    score.add_argument(
        "--params",
        help='scoring parameters as nested JSON, e.g. \'{"data": {"max_bad_fraction": 0.5}}\'; '
        "flags win",
    )
    score.add_argument(
        "--serve", action="store_true", help="serve as a Prefect deployment instead of running once"
    )
    score.add_argument("--cron", help="with --serve: a schedule, e.g. '0 5 * * *'")
    score.set_defaults(func=handlers["score"])


def _add_bench(commands: Commands, handlers: Mapping[str, Handler]) -> None:
    bench = commands.add_parser(
        "bench",
        help="benchmark a model like the paper: baseline and np sweep, ANOVA, Tukey, plots",
        description="Sweep conditions (plain Keras, then np=1,2,...) with repetitions and "
        "epochs; report epoch times, images/s, scaling efficiency, ANOVA and Tukey HSD.",
    )
    bench.add_argument("--model", help="mnist_cnn (default), digits_mlp, vgg16, inceptionv3")
    bench.add_argument(
        "--conditions",
        help="comma-separated (default keras,keras1,ceiling2,hvd1,hvd2,tf2; without Horovod "
        "keras,keras1,ceiling2,tf1,tf2): keras (one process, "
        "every core), kerasN (N threads), ceilingN (N Keras processes at once), hvdN "
        "(HorovodRunner, N ranks), tfN (the tf_collective engine)",
    )
    bench.add_argument("--repetitions", type=int)
    bench.add_argument("--threads-per-rank", type=int, help="threads of each rank (default 1)")
    bench.add_argument(
        "--images", type=int, help="training images of the augmented digits (default 60000)"
    )
    bench.add_argument("--epochs", type=int)
    bench.add_argument(
        "--target-accuracy",
        type=float,
        help="val_accuracy whose time to reach the table reports per condition (default 0.97)",
    )
    bench.add_argument(
        "--eval-every",
        type=float,
        help="evaluate a fixed validation subset every this fraction of an epoch, for the time "
        "to the target (default 0.1; 0: at epoch ends only)",
    )
    bench.add_argument("--optimizer", help="adadelta (default), rmsprop, adam, radam, sgd")
    bench.add_argument("--input")
    bench.add_argument("--input-format", choices=["folders", "mnist_idx", "digits"])
    bench.add_argument("--params", help="benchmark parameters as nested JSON; flags win")
    bench.set_defaults(func=handlers["bench"])


def _add_bench_input(commands: Commands, handlers: Mapping[str, Handler]) -> None:
    feed = commands.add_parser(
        "bench-input",
        help="can the reader feed an accelerator? MLPerf Storage's AU with an emulated device",
        description="Ranks read a preprocessed dataset as training does and sleep for a "
        "device's step time per batch; prints each rank's accelerator utilisation (AU: compute "
        "time over wall time, the first step left out), images/s, the reader's CPU-ms per image "
        "and how many such devices one core and this host keep at 90%% AU.",
    )
    feed.add_argument("dataset", help="a preprocessed dataset (its version folder or a split)")
    feed.add_argument(
        "--preset",
        default="vgg16-h200-bf16",
        help="the emulated device (default vgg16-h200-bf16; also vgg16-h200-fp32, "
        "inceptionv3-h200-bf16, resnet50-h100, resnet50-a100)",
    )
    feed.add_argument("--step-ms", type=float, help="milliseconds per batch instead of a preset")
    feed.add_argument("--batch-size", type=int, help="images per batch (the preset's: scaled)")
    feed.add_argument("--np", type=int, default=1, help="ranks, processes of this host")
    feed.add_argument("--epochs", type=int, default=3)
    feed.add_argument(
        "--feed",
        default="tf.data",
        choices=["tf.data", "numpy", "in-memory"],
        help="tf.data: streamed as a Keras rank reads it; numpy: streamed as a PyTorch loop "
        "would; in-memory: the shard loaded once",
    )
    feed.add_argument("--reader", choices=["pyarrow", "petastorm"], help="for tf.data")
    feed.add_argument(
        "--cpus-per-rank", type=int, default=0, help="pin each rank to this many cores (0: no)"
    )
    feed.add_argument("--out", help="write every rank's epochs as JSON here")
    feed.set_defaults(func=handlers["bench-input"])
