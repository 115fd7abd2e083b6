"""Preprocessing from a bucket on the multi-host harness, 2 worker hosts against 1, and the
pipeline's end-to-end wall clock there, measured side by side in one run.

The harness (tests/cluster) gives two one-core worker hosts in network and mount namespaces;
the embedded services run on the driver's host, bound to its bridge address with their
credentials (``hvdflow up --bind``). The same Caltech101-like JPEGs sit in the bucket for every
measurement. Each preprocessing run is a fresh driver whose executors are warmed by a first
small job; the time measured is ``preprocess_images`` alone, from the bucket into the bucket,
with ``spark.cores.max`` at 1 (one host) or 2 (both). Rounds alternate 1 and 2. Then one
``hvdflow run --np 2`` on the digits in the bucket gives the pipeline's wall clock, launch and
services' round trips included. Needs root and iproute2, like the tests on the harness.

    .venv/bin/python -m tests.cluster.throughput

It lives beside the harness it runs on, under tests/: run it from a checkout (the wheel
ships neither).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from hvdflow.infra._env import temporary_env
from hvdflow.infra.services.local import LocalServices
from studies.preprocess_throughput import make_caltech_like, make_small_images

PREPROCESS = textwrap.dedent(
    """
    import json, sys, time
    from hvdflow.infra.spark import get_spark
    from hvdflow.tasks.preprocess import PreprocessConfig, preprocess_images

    source, output, cores = sys.argv[1], sys.argv[2], sys.argv[3]
    spark = get_spark(conf={"spark.cores.max": cores})
    spark.sparkContext.parallelize(range(8), 8).map(lambda x: x).count()  # executors up
    config = PreprocessConfig(
        input=source, input_format="folders", output=output, image_size=(224, 224),
        color_mode="RGB",
    )
    started = time.perf_counter()
    manifest = preprocess_images(spark, config)
    seconds = time.perf_counter() - started
    rows = manifest.train_rows + manifest.val_rows
    print("RESULT " + json.dumps({"rows": rows, "seconds": seconds}))
    spark.stop()
    """
)


def upload_tree(store, root: Path, prefix: str) -> int:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    for path in files:
        store.upload_file(str(path), prefix + str(path.relative_to(root)))
    return len(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000, help="Caltech101-like JPEGs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--digits", type=int, default=400, help="images for the pipeline run")
    args = parser.parse_args(argv)

    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig  # noqa: PLC0415 (lazy: it loads boto3)
    from tests.cluster import netns
    from tests.cluster.driver import run_driver
    from tests.cluster.spark_cluster import netns_spark_cluster

    if (reason := netns.unavailable_reason()) is not None:
        print(f"the multi-host harness cannot run here: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hvdflow-cluster-bench-"))
    make_caltech_like(work / "caltech", args.images)
    make_small_images(work / "digits", args.digits)
    with netns_spark_cluster(work / "cluster", workers=2, cores=1, kind="bench") as cluster:
        services = LocalServices(work / "home")
        try:
            env = services.up(bind=cluster.driver_ip)
            with temporary_env(env):
                store = ObjectStore(ObjectStoreConfig.from_env(bucket="hvdflow"))
                store.ensure_bucket()
                uploaded = upload_tree(store, work / "caltech", "s3://hvdflow/bench/caltech/")
                upload_tree(store, work / "digits", "s3://hvdflow/bench/digits/")
            print(f"{uploaded} JPEGs in s3://hvdflow/bench/caltech/ at {env['AWS_ENDPOINT_URL']}")
            aws = {k: v for k, v in env.items() if k.startswith("AWS_")}
            rates: dict[int, list[float]] = {1: [], 2: []}
            for round_ in range(args.rounds):
                for hosts in (1, 2):
                    run = run_driver(
                        cluster,
                        "-c",
                        PREPROCESS,
                        "s3://hvdflow/bench/caltech/",
                        f"s3://hvdflow/bench/out-{round_}-{hosts}",
                        str(hosts),
                        workdir=work / f"driver-{round_}-{hosts}",
                        timeout_s=1800,
                        env=aws,
                    )
                    if run.returncode != 0:
                        print(run.stderr[-4000:], file=sys.stderr)
                        return 1
                    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("RESULT "))
                    result = json.loads(line.removeprefix("RESULT "))
                    rates[hosts].append(result["rows"] / result["seconds"])
                    print(
                        f"  round {round_ + 1}, {hosts} host(s): {result['rows']} images in "
                        f"{result['seconds']:.1f} s = {rates[hosts][-1]:.1f} images/s",
                        flush=True,
                    )
            started = time.perf_counter()
            pipeline = run_driver(
                cluster,
                "-m",
                "hvdflow.flows.cli",
                "run",
                *("--np", "2", "--epochs", "2", "--input-format", "folders"),
                *("--input", "s3://hvdflow/bench/digits/", "--output", "s3://hvdflow/bench/e2e"),
                workdir=work / "pipeline",
                timeout_s=1800,
                env={"HVDFLOW_HOME": str(work / "home")},
            )
            wall = time.perf_counter() - started
            if pipeline.returncode != 0:
                print(pipeline.stderr[-4000:], file=sys.stderr)
                return 1
        finally:
            services.down()
    best_one, best_two = max(rates[1]), max(rates[2])
    print(f"\npreprocessing {args.images} JPEGs ~300x200 -> 224x224 RGB, bucket to bucket")
    print(f"  1 worker host (1 core)   {best_one:8.1f} images/s (best of {args.rounds})")
    print(f"  2 worker hosts (1 core each) {best_two:8.1f} images/s (best of {args.rounds})")
    print(f"  ratio 2 hosts / 1 host   {best_two / best_one:8.2f}")
    print(f"pipeline end to end (hvdflow run --np 2, {args.digits} digits, 2 epochs): {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
