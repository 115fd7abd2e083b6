"""The ``hvdflow`` command line.

Exit codes: 0 done, 1 the run failed (one line says why and where the full log is), 2 a bad
command line or parameter (one line names the parameter, the value and what is accepted).
``--debug`` shows tracebacks instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from hvdflow.flows.cli_support import (
    FailedRun,
    InvalidParameters,
    adopt_prefect_logging,
    configure_logging,
    nested_params,
    one_line,
)
from hvdflow.flows.status import gather, render
from hvdflow.infra import HorovodRunner
from hvdflow.infra.services import check_bind_address
from hvdflow.infra.services.local import LocalServices
from hvdflow.training.smoke import train_digits


def _cmd_smoke(args: argparse.Namespace) -> int:
    runner = HorovodRunner(np=args.np, driver_log_verbosity=args.driver_log_verbosity)
    result = runner.run(train_digits, epochs=args.epochs)
    same = len(set(result["checksums"])) == 1
    print(json.dumps({**result, "identical_weights": same, "log": runner.log_path}, indent=2))
    return 0 if same and result["size"] == abs(args.np) else 1


def _use_services(prefect: bool = True) -> dict[str, str]:
    """Start the embedded services that the environment does not already point elsewhere, and
    point this process at them, Prefect included (it reads its settings once, at import)."""
    env = LocalServices().up(prefect=prefect)
    os.environ.update(env)
    adopt_prefect_logging()
    return env


def _cmd_up(args: argparse.Namespace) -> int:
    if args.bind is not None:
        try:
            check_bind_address(args.bind)
        except ValueError as e:
            raise InvalidParameters(f"--bind: {e}") from None
    services = LocalServices()
    services.up(prefect=not args.no_prefect, bind=args.bind)
    urls = services.urls()
    print("hvdflow services are up:")
    labels = {"s3": "object store (S3)", "mlflow": "MLflow UI", "prefect_ui": "Prefect UI"}
    for key, label in labels.items():
        if key in urls:
            print(f"  {label:<18} {urls[key]}")
    print("\nTo use them from another shell (secrets are shown as where they are kept):")
    secrets = services.secret_sources()
    for key, value in services.env().items():
        print(f"  export {key}={f'<{secrets[key]}>' if key in secrets else value}")
    print("\nStop them with: hvdflow down")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from hvdflow.tasks.config import TrackingParams  # noqa: PLC0415 (lazy: it loads Spark)

    model = args.model or TrackingParams().registered_model_name
    experiment = args.experiment or TrackingParams().experiment
    status = gather(LocalServices(), os.environ, model, experiment, args.last)
    print("\n".join(render(status)))
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    stopped = LocalServices().down()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


# Command-line flags and the nested parameter each one sets.
PIPELINE_FLAGS = {
    "np": "launcher.np",
    "spark_master": "launcher.spark_master",
    "epochs": "training.epochs",
    "model": "training.model",
    "input": "data.input",
    "input_format": "data.input_format",
    "output": "data.output",
    "resume": "tracking.resume",
}
BENCH_FLAGS = {
    "model": "training.model",
    "epochs": "training.epochs",
    "optimizer": "training.optimizer",
    "input": "data.input",
    "input_format": "data.input_format",
    "repetitions": "repetitions",
    "threads_per_rank": "threads_per_rank",
    "images": "images",
    "conditions": "conditions",
    "target_accuracy": "target_accuracy",
}
SCORE_FLAGS = {
    "input": "data.input",
    "input_format": "data.input_format",
    "output": "data.output",
    "batch_size": "data.batch_size",
    "model": "model.name",
    "alias": "model.alias",
    "version": "model.version",
    "spark_master": "spark_master",
}


def _pipeline_params(args: argparse.Namespace):
    from hvdflow.flows.params import (  # noqa: PLC0415 (lazy: it loads Spark)
        PipelineParams,  # no Prefect yet: it must see the services first
    )

    return nested_params(PipelineParams, args, PIPELINE_FLAGS)


def _cmd_run(args: argparse.Namespace) -> int:
    params = _pipeline_params(args)  # a bad parameter fails before any service starts
    _use_services()
    from hvdflow.flows.pipeline import (  # noqa: PLC0415 (lazy: it loads Spark)
        pipeline,
        profile_lines,
        throughput_lines,
    )

    summary = pipeline(params)
    urls = LocalServices().urls()
    print("\nhvdflow pipeline finished. Where to look:")
    print(f"  MLflow run       {summary['mlflow_run_url']}")
    print(f"  model version    {summary['model']}  {summary['model_url'] or ''}")
    print(f"                   aliases: {', '.join(summary['aliases']) or 'none'}")
    if summary.get("flow_run_url"):
        print(f"  Prefect UI       {summary['flow_run_url']}")
    elif "prefect_ui" in urls and summary["flow_run_id"]:
        print(f"  Prefect UI       {urls['prefect_ui']}/runs/flow-run/{summary['flow_run_id']}")
    print(f"  dataset          {summary['dataset']} ({summary['quarantined']} quarantined)")
    for i, line in enumerate(throughput_lines(summary)):
        print(f"  {'throughput' if i == 0 else '':<16} {line}")
    for line in profile_lines(summary):
        print(f"  {'profile':<16} {line}")
    print("Stop the services with: hvdflow down")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    params = _pipeline_params(args)
    _use_services()
    from prefect import serve

    from hvdflow.flows.benchmark import benchmark  # noqa: PLC0415 (lazy: it loads Spark)
    from hvdflow.flows.pipeline import pipeline  # noqa: PLC0415 (lazy: it loads Spark)

    deployments = [
        pipeline.to_deployment(
            name="hvdflow-pipeline",
            cron=args.cron,
            parameters={"params": params.model_dump(mode="json")},
        ),
        benchmark.to_deployment(name="hvdflow-benchmark", cron=args.bench_cron),
    ]
    # One run at a time: they share this machine's cores and its Spark task slots.
    serve(*deployments, limit=1)
    return 0


def _cmd_deploy(args: argparse.Namespace) -> int:
    params = _pipeline_params(args)  # a bad parameter fails before anything is deployed
    score_params = None
    if args.score_input:
        from hvdflow.flows.params import ScoreParams  # noqa: PLC0415 (lazy: it loads Spark)

        # Scoring follows the model the pipeline deployment registers.
        score_params = ScoreParams(
            model={"name": params.tracking.registered_model_name},
            data={"input": args.score_input},
        )
    elif args.score_on_champion:
        raise InvalidParameters(
            "--score-on-champion needs --score-input: the folder or s3://bucket/prefix of the "
            "images each new champion scores"
        )
    _use_services()
    from hvdflow.flows.deploy import deploy_all, deployments  # noqa: PLC0415 (lazy: it loads Spark)

    made = deployments(
        params,
        cron=args.cron or None,
        bench_cron=args.bench_cron or None,
        score_params=score_params,
        score_cron=args.score_cron,
        score_on_champion=args.score_on_champion,
    )
    deploy_all(args.pool, made)
    print(f"\ndeployed to work pool {args.pool!r} (module entrypoints: no checkout needed):")
    for deployment in made:
        schedule = ", ".join(str(s.schedule.cron) for s in deployment.schedules) or "on demand"
        triggered = " and on each new champion" if deployment.triggers else ""
        print(f"  {deployment.flow_name}/{deployment.name:<20} {schedule}{triggered}")
    print(f"Start a worker where hvdflow is installed: prefect worker start --pool {args.pool}")
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from hvdflow.flows.params import ScoreParams  # noqa: PLC0415 (lazy: it loads Spark)

    if args.input is None and '"input"' not in (args.params or ""):
        raise InvalidParameters(
            "data.input (--input) is required: the folder or s3://bucket/prefix of the images "
            "to score (or of a Parquet dataset, with --input-format dataset)"
        )
    params = nested_params(ScoreParams, args, SCORE_FLAGS)  # before any service starts
    _use_services()
    from hvdflow.flows.score import score  # noqa: PLC0415 (lazy: it loads Spark)

    if args.serve:
        from prefect import serve

        deployment = score.to_deployment(
            name="hvdflow-score",
            cron=args.cron,
            parameters={"params": params.model_dump(mode="json")},
        )
        serve(deployment, limit=1)
        return 0
    summary = score(params)
    print("\nhvdflow score finished. Where to look:")
    print(f"  model version    {summary['model']} (asked for {summary['model_asked']})")
    print(f"  predictions      {summary['predictions']}")
    print(f"  scored           {summary['scored']} images ({summary['quarantined']} quarantined)")
    print("  per class        " + ", ".join(f"{k}: {v}" for k, v in summary["counts"].items()))
    print(f"  MLflow run       {summary['mlflow_run_url']}")
    print(f"  throughput       {summary['images_per_s']} images/s")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from hvdflow.flows.params import BenchParams  # noqa: PLC0415 (lazy: it loads Spark)

    if args.conditions:
        args.conditions = args.conditions.split(",")
    params = nested_params(BenchParams, args, BENCH_FLAGS)
    _use_services()
    from hvdflow.flows.benchmark import benchmark  # noqa: PLC0415 (lazy: it loads Spark)

    result = benchmark(params)
    if result["dataset"].get("workload"):
        print(
            f"workload: {result['dataset']['workload']}, {result['dataset']['train_rows']} "
            "training images\n"
        )
    print(result["table"])
    print("\nplots: " + ", ".join(result["plots"]))
    print(f"MLflow run: {result['mlflow_run_id']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
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
    smoke.set_defaults(func=_cmd_smoke)

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
    up.set_defaults(func=_cmd_up)

    down = commands.add_parser("down", help="stop the services `hvdflow up` started")
    down.set_defaults(func=_cmd_down)

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
    status.set_defaults(func=_cmd_status)

    for name, help_text, func in (
        ("run", "run the pipeline once (starts the services if needed)", _cmd_run),
        ("serve", "serve the pipeline as a scheduled Prefect deployment", _cmd_serve),
        (
            "deploy",
            "register the pipeline, benchmark and scoring deployments with a work pool "
            "(module entrypoints: workers need hvdflow installed, not a checkout)",
            _cmd_deploy,
        ),
    ):
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument("--np", type=int, help="ranks (default 2; negative: on the driver)")
        command.add_argument("--epochs", type=int)
        command.add_argument("--input", help="image folder (class sub-folders) or IDX folder")
        command.add_argument("--input-format", choices=["folders", "mnist_idx", "digits"])
        command.add_argument("--output", help="dataset root: a path or s3://bucket/prefix")
        command.add_argument("--model", help="digits_mlp, mnist_cnn, vgg16, inceptionv3")
        command.add_argument("--spark-master", help="default: $HVDFLOW_SPARK_MASTER or local[N]")
        command.add_argument(
            "--params",
            help='pipeline parameters as nested JSON, e.g. \'{"training": {"optimizer": '
            '"sgd"}, "launcher": {"horovod": {"cycle_time_ms": 10}}}\'; flags win',
        )
        command.set_defaults(func=func)
        if name == "run":
            command.add_argument(
                "--resume",
                nargs="?",
                const="last",
                metavar="RUN_ID",
                help="continue a training that failed for good, in its MLflow run, from its last "
                "checkpoint: the experiment's newest failed run, or RUN_ID",
            )
        if name in ("serve", "deploy"):
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
        if name == "deploy":
            command.add_argument(
                "--pool", required=True, help="the work pool (a process pool is created if none)"
            )
            command.add_argument(
                "--score-input",
                help="what the scoring deployment scores by default: a folder or s3://bucket/prefix",
            )
            command.add_argument("--score-cron", help="scoring schedule (default: none)")
            command.add_argument(
                "--score-on-champion",
                action="store_true",
                help="score --score-input with each new champion (a Prefect trigger on the "
                "hvdflow.model.champion-moved event)",
            )
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
    score.add_argument("--spark-master", help="default: $HVDFLOW_SPARK_MASTER or local[N]")
    score.add_argument(
        "--params",
        help='scoring parameters as nested JSON, e.g. \'{"data": {"max_bad_fraction": 0.5}}\'; '
        "flags win",
    )
    score.add_argument(
        "--serve", action="store_true", help="serve as a Prefect deployment instead of running once"
    )
    score.add_argument("--cron", help="with --serve: a schedule, e.g. '0 5 * * *'")
    score.set_defaults(func=_cmd_score)

    bench = commands.add_parser(
        "bench",
        help="benchmark a model like the paper: baseline and np sweep, ANOVA, Tukey, plots",
        description="Sweep conditions (plain Keras, then np=1,2,...) with repetitions and "
        "epochs; report epoch times, images/s, scaling efficiency, ANOVA and Tukey HSD.",
    )
    bench.add_argument("--model", help="mnist_cnn (default), digits_mlp, vgg16, inceptionv3")
    bench.add_argument(
        "--conditions",
        help="comma-separated (default keras,keras1,ceiling2,hvd1,hvd2,tf2): keras (one process, "
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
    bench.add_argument("--optimizer", help="adadelta (default), rmsprop, adam, radam, sgd")
    bench.add_argument("--input")
    bench.add_argument("--input-format", choices=["folders", "mnist_idx", "digits"])
    bench.add_argument("--params", help="benchmark parameters as nested JSON; flags win")
    bench.set_defaults(func=_cmd_bench)
    return parser


def score_main(argv: list[str] | None = None) -> int:
    """``hvdflow-score ...``: the same as ``hvdflow score ...``."""
    return main(["score", *(sys.argv[1:] if argv is None else argv)])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_path = configure_logging(args.log_level, args.command, show_tracebacks=args.debug)
    try:
        return args.func(args)
    except InvalidParameters as e:
        if args.debug:
            raise
        print(f"hvdflow {args.command}: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        logging.getLogger("hvdflow").exception("hvdflow %s failed", args.command)
        if args.debug:
            raise
        print(FailedRun(args.command, one_line(e), log_path), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
