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
from dataclasses import asdict
from pathlib import Path

from hvdflow.flows import cli_parser
from hvdflow.flows.cli_support import (
    FailedRun,
    InvalidParameters,
    adopt_prefect_logging,
    configure_logging,
    nested_params,
    one_line,
)
from hvdflow.flows.status import gather, render
from hvdflow.infra.services import check_bind_address
from hvdflow.infra.services.local import LocalServices


def _cmd_smoke(args: argparse.Namespace) -> int:
    from hvdflow.infra import HorovodRunner  # noqa: PLC0415 (lazy: a tenth of a second of imports)
    from hvdflow.training.smoke import train_digits  # noqa: PLC0415 (lazy: it loads NumPy)

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
    from hvdflow.tasks.config import TrackingParams  # noqa: PLC0415 (lazy: it loads NumPy)

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
    "framework": "training.framework",
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
    "eval_every": "training.eval_every",
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
    from hvdflow.flows.params import (  # noqa: PLC0415 (lazy: it loads NumPy)
        PipelineParams,  # no Prefect yet: it must see the services first
    )

    return nested_params(PipelineParams, args, PIPELINE_FLAGS)


def _cmd_run(args: argparse.Namespace) -> int:
    params = _pipeline_params(args)  # a bad parameter fails before any service starts
    _use_services()
    from hvdflow.flows.prefect.pipeline import pipeline  # noqa: PLC0415 (lazy: it loads Spark)
    from hvdflow.tasks.train.summary import profile_lines, throughput_lines  # noqa: PLC0415

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

    from hvdflow.flows.prefect.benchmark import benchmark  # noqa: PLC0415 (lazy: it loads Spark)
    from hvdflow.flows.prefect.pipeline import pipeline  # noqa: PLC0415 (lazy: it loads Spark)

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
        from hvdflow.flows.params import ScoreParams  # noqa: PLC0415 (lazy: it loads NumPy)

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
    if (args.network or args.env) and not args.image:
        raise InvalidParameters("--network and --env are for a Docker pool: give --image too")
    extra = dict(_name_value(item, "--env") for item in args.env)
    from hvdflow.flows.prefect import docker_pool  # noqa: PLC0415 (lazy: it loads Prefect)

    try:
        if args.image:
            docker_pool.check_image(args.image)  # before any service starts
    except docker_pool.DockerPoolError as e:
        raise InvalidParameters(str(e)) from None
    _use_services()
    from hvdflow.flows.prefect.deploy import WrongPoolType, deploy_all, deployments  # noqa: PLC0415 (lazy: it loads Spark)

    variables = None
    if args.image:
        try:
            env = docker_pool.service_env(extra)
            variables = docker_pool.job_variables(args.image, args.network, env)
        except docker_pool.DockerPoolError as e:
            raise InvalidParameters(str(e)) from None
    made = deployments(
        params,
        cron=args.cron or None,
        bench_cron=args.bench_cron or None,
        score_params=score_params,
        score_cron=args.score_cron,
        score_on_champion=args.score_on_champion,
        job_variables=variables,
    )
    kind = docker_pool.DOCKER if args.image else "process"
    try:
        deploy_all(args.pool, made, kind)
    except WrongPoolType as e:
        raise InvalidParameters(str(e)) from None
    where = f"in containers of {args.image}" if args.image else "module entrypoints"
    print(f"\ndeployed to work pool {args.pool!r} ({where}: no checkout needed):")
    for deployment in made:
        schedule = ", ".join(str(s.schedule.cron) for s in deployment.schedules) or "on demand"
        triggered = " and on each new champion" if deployment.triggers else ""
        print(f"  {deployment.flow_name}/{deployment.name:<20} {schedule}{triggered}")
    if args.image:
        print(f"Start a worker beside a Docker engine: prefect worker start --pool {args.pool} "
              "--type docker (hvdflow[docker] installed)")  # fmt: skip
    else:
        print(f"Start a worker where hvdflow is installed: prefect worker start --pool {args.pool}")
    return 0


def _name_value(item: str, flag: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise InvalidParameters(f"{flag} {item!r}: expected NAME=VALUE")
    return name, value


def _cmd_score(args: argparse.Namespace) -> int:
    from hvdflow.flows.params import ScoreParams  # noqa: PLC0415 (lazy: it loads NumPy)

    if args.input is None and '"input"' not in (args.params or ""):
        raise InvalidParameters(
            "data.input (--input) is required: the folder or s3://bucket/prefix of the images "
            "to score (or of a Parquet dataset, with --input-format dataset)"
        )
    params = nested_params(ScoreParams, args, SCORE_FLAGS)  # before any service starts
    _use_services()
    from hvdflow.flows.prefect.scoring import score  # noqa: PLC0415 (lazy: it loads Spark)

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
    from hvdflow.flows.params import BenchParams  # noqa: PLC0415 (lazy: it loads NumPy)

    if args.conditions:
        args.conditions = args.conditions.split(",")
    params = nested_params(BenchParams, args, BENCH_FLAGS)
    _use_services()
    from hvdflow.flows.prefect.benchmark import benchmark  # noqa: PLC0415 (lazy: it loads Spark)

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


def _cmd_bench_input(args: argparse.Namespace) -> int:
    from hvdflow.bench import feed  # noqa: PLC0415 (lazy: it loads pyarrow)

    try:
        device = feed.accelerator(args.preset, args.step_ms, args.batch_size)
        url = feed.split_url(args.dataset)
    except ValueError as e:
        raise InvalidParameters(str(e)) from None
    run = feed.FeedRun(
        url, args.feed, device, args.np, args.epochs, args.reader, args.cpus_per_rank
    )
    feeds = feed.run_ranks(run)
    print("\n" + feed.summary(feeds, device))
    if args.out:
        rows = [{**asdict(f), "au": f.au, "images_per_s": f.images_per_s} for f in feeds]
        Path(args.out).write_text(json.dumps({"device": asdict(device), "epochs": rows}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``hvdflow`` parser (``hvdflow.flows.cli_parser``), each command given its function."""
    return cli_parser.build_parser(
        {
            "smoke": _cmd_smoke,
            "up": _cmd_up,
            "down": _cmd_down,
            "status": _cmd_status,
            "run": _cmd_run,
            "serve": _cmd_serve,
            "deploy": _cmd_deploy,
            "score": _cmd_score,
            "bench": _cmd_bench,
            "bench-input": _cmd_bench_input,
        }
    )


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
