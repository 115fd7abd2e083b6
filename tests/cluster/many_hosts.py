"""np=8 on eight hosts against np=2 on two, side by side in one run: what grows with np.

The multi-host harness (tests/cluster) gives ``--hosts`` one-core worker hosts, each in its own
network and mount namespaces. They share this machine's cores, so this measures what grows with
np (launch, rendezvous, allreduce and waiting, driver memory, log volume), not speed.

1. Probe: ``HorovodRunner(np).run(probe)`` for np = ``--small`` and ``--hosts``, alternating over
   ``--rounds``. Each rank notes when it began, when TensorFlow and Horovod were imported and when
   ``hvd.init()`` returned; then it times ``--steps`` training steps of the paper's MNIST CNN on
   its own (compute) and the same steps with Horovod's allreduce of the gradients (compute,
   allreduce, and waiting for the slowest rank), and one allreduce of the gradients' size alone.
   The driver samples its own memory (Python and its Spark JVM) during the run.
2. Pipeline: ``hvdflow run`` on digits in the harness's bucket, np = ``--small`` and then np =
   ``--hosts``; in the second, one rank is SIGKILLed once epoch 2 begins: how long until the
   driver names it, and until the retried attempt begins an epoch again. Driver memory and the
   ranks' log volume per epoch for both.

    .venv/bin/python -m tests.cluster.many_hosts --hosts 8

It lives beside the harness it runs on, under tests/: run it from a checkout (the wheel
ships neither).

Needs root and iproute2, like the tests on the harness.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil

from hvdflow.infra._env import temporary_env
from hvdflow.infra.services.local import LocalServices
from studies.preprocess_throughput import make_small_images
from tests.cluster.throughput import upload_tree

RANK_ENTRY = "hvdflow.infra.launcher._rank"

PROBE = textwrap.dedent(
    """
    import json, sys, threading, time
    import psutil
    from hvdflow import HorovodRunner
    from hvdflow.infra.spark import get_spark

    def probe(launched_at, steps):
        import statistics, time
        began = time.time()
        import horovod.tensorflow as hvd
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        imported = time.time()
        hvd.init()
        initialised = time.time()
        tf.random.set_seed(hvd.rank())
        layers = tf.keras.layers
        model = tf.keras.Sequential([
            layers.Input((28, 28, 1)),
            layers.Conv2D(32, 3, activation="relu"),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
        ])
        x = tf.random.uniform((32, 28, 28, 1))
        y = tf.random.uniform((32,), maxval=10, dtype=tf.int64)
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        opt = tf.keras.optimizers.SGD(0.01)

        @tf.function
        def local_step():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        @tf.function
        def synced_step():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        def timed(step):
            for _ in range(3):
                step()
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                step()
                times.append(time.perf_counter() - t)
            return statistics.median(times)

        compute = timed(local_step)
        hvd.allreduce(tf.constant(0.0), name="barrier-1")
        synced = timed(synced_step)
        size = sum(int(tf.size(v)) for v in model.trainable_variables)
        tensor = tf.ones((size,))
        hvd.allreduce(tf.constant(0.0), name="barrier-2")
        reduce_times = []
        for i in range(steps):
            t = time.perf_counter()
            hvd.allreduce(tensor, name=f"alone-{i}")
            reduce_times.append(time.perf_counter() - t)
        mine = {
            "rank": hvd.rank(), "began": began - launched_at, "imported": imported - launched_at,
            "initialised": initialised - launched_at, "compute_s": compute, "synced_s": synced,
            "allreduce_s": statistics.median(reduce_times), "parameters": size,
        }
        return hvd.allgather_object(mine)

    def peak_rss(stop, peak):
        me = psutil.Process()
        while not stop.is_set():
            try:
                rss = me.memory_info().rss + sum(
                    c.memory_info().rss for c in me.children(recursive=True))
            except psutil.Error:
                continue
            peak[0] = max(peak[0], rss)
            time.sleep(0.2)

    spark = get_spark()
    spark.sparkContext.setLogLevel("ERROR")
    small, large, rounds, steps = (int(a) for a in sys.argv[1:5])
    for round_ in range(rounds):
        for np in (small, large):
            stop, peak = threading.Event(), [0]
            sampler = threading.Thread(target=peak_rss, args=(stop, peak), daemon=True)
            sampler.start()
            runner = HorovodRunner(np=np)
            launched_at = time.time()
            ranks = runner.run(probe, launched_at=launched_at, steps=steps)
            wall = time.time() - launched_at
            stop.set()
            sampler.join()
            import os
            print("RESULT " + json.dumps({
                "np": np, "round": round_, "wall_s": wall, "ranks": ranks,
                "driver_peak_mb": peak[0] / 2**20, "log_bytes": os.path.getsize(runner.log_path),
            }), flush=True)
    spark.stop()
    """
)


def summarise_probe(result: dict) -> dict:
    ranks = result["ranks"]
    last_imported = max(r["imported"] for r in ranks)
    return {
        "np": result["np"],
        "first rank began (s)": min(r["began"] for r in ranks),
        "last rank began (s)": max(r["began"] for r in ranks),
        "launch to hvd.init() on every rank (s)": max(r["initialised"] for r in ranks),
        "rendezvous after the last import (s)": max(r["initialised"] for r in ranks)
        - last_imported,
        "step, compute alone (ms)": 1000 * statistics.median(r["compute_s"] for r in ranks),
        "step with allreduce (ms)": 1000 * statistics.median(r["synced_s"] for r in ranks),
        "beyond compute (ms)": 1000
        * statistics.median(r["synced_s"] - r["compute_s"] for r in ranks),
        "allreduce alone (ms)": 1000 * statistics.median(r["allreduce_s"] for r in ranks),
        "driver peak RSS (MB)": result["driver_peak_mb"],
        "run log (KB)": result["log_bytes"] / 1024,
    }


def print_table(rows: list[dict]) -> None:
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(_cell(row[k]) for k in keys) + " |")


def _cell(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


class PipelineRun:
    """``hvdflow run`` as the cluster's driver, its output read line by line."""

    def __init__(self, cluster, home: Path, work: Path, np: int, epochs: int, kill_host=None):
        from tests.cluster.driver import start_cli

        self.cluster, self.kill_host, self.epochs = cluster, kill_host, epochs
        argv = ["run", "--np", str(np), "--epochs", str(epochs), "--input-format", "folders"]
        argv += ["--input", "s3://hvdflow/bench/digits/", "--output", "s3://hvdflow/bench/ds"]
        argv += ["--params", json.dumps({"training": {"batch_size": 16}})]
        self.started = time.time()
        # The services `up` started for the cluster, in that home: not new ones on loopback.
        self.proc = start_cli(cluster, argv, workdir=work, home=home)
        self.lines: list[str] = []
        self.killed_at: float | None = None
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        driver = psutil.Process(self.proc.pid)
        while not self._stop.is_set():
            try:
                rss = driver.memory_info().rss + sum(
                    c.memory_info().rss for c in driver.children(recursive=True)
                )
                self.peak_rss = max(self.peak_rss, rss)
            except psutil.Error:
                pass
            time.sleep(0.2)

    def finish(self, timeout_s: float = 1800) -> int:
        from tests.cluster import processes

        try:
            for line in self.proc.stdout:
                self.lines.append(line)
                print("   " + line.rstrip()[:160], flush=True)
                if (
                    self.kill_host is not None
                    and self.killed_at is None
                    and line.rstrip().endswith(f"<log>:Epoch 2/{self.epochs}")
                ):
                    self.killed_at = self._kill_a_rank()
            return self.proc.wait(timeout_s)
        finally:
            self._stop.set()
            processes.stop_groups([self.proc], grace_s=5)

    def _kill_a_rank(self) -> float | None:
        host = self.cluster.host(self.kill_host)
        inode = self.cluster.netns_inodes[host.netns]
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if RANK_ENTRY in (proc.info["cmdline"] or []) and _net_inode(proc.pid) == inode:
                    proc.send_signal(signal.SIGKILL)
                    return time.time()
            except psutil.Error:
                continue
        return None

    def figures(self) -> dict:
        from tests.cluster.driver import logged_at

        out = "".join(self.lines)
        rank_lines = [ln for ln in self.lines if re.search(r"\[\d+,\d+\]<", ln)]
        # A steady epoch: from the last attempt's next-to-last epoch to its last one.
        last = self.epochs
        begun = [i for i, ln in enumerate(rank_lines) if f"<log>:Epoch {last - 1}/{last}" in ln]
        ended = [i for i, ln in enumerate(rank_lines) if f"<log>:Epoch {last}/{last}" in ln]
        steady = rank_lines[begun[-1] : ended[-1]] if begun and ended else []
        figures = {
            "wall (s)": time.time() - self.started,
            "driver peak RSS (MB)": self.peak_rss / 2**20,
            "rank log lines, whole run": len(rank_lines),
            "rank log KB, whole run": sum(len(ln) for ln in rank_lines) / 1024,
            "rank log lines, steady epoch": len(steady),
        }
        if self.killed_at is not None:
            after = [
                (logged_at(ln), ln) for ln in self.lines if (logged_at(ln) or 0) >= self.killed_at
            ]
            named = next((t for t, ln in after if "was killed by SIGKILL" in ln), None)
            resumed = next(
                (
                    t
                    for t, ln in after
                    if named and t >= named and re.search(r"<log>:Epoch \d+/", ln)
                ),
                None,
            )
            figures["rank named after the kill (s)"] = named - self.killed_at if named else None
            figures["next attempt's first epoch after the kill (s)"] = (
                resumed - self.killed_at if resumed else None
            )
        figures["model registered"] = bool(re.search(r"model version\s+models:/", out))
        return figures


def _net_inode(pid: int) -> int | None:
    from tests.cluster.spark_cluster import _net_inode as inode

    return inode(pid)


def probe_and_print(cluster, work: Path, args: argparse.Namespace) -> int:
    """The probe's rounds on the cluster, as a table; 0, or 1 if the driver failed."""
    from tests.cluster.driver import run_driver

    probe = run_driver(
        cluster,
        "-c",
        PROBE,
        *(str(v) for v in (args.small, args.hosts, args.rounds, args.steps)),
        workdir=work / "probe",
        timeout_s=1800,
    )
    if probe.returncode != 0:
        print(probe.stdout[-3000:], probe.stderr[-6000:], file=sys.stderr)
        return 1
    results = [
        json.loads(ln.removeprefix("RESULT "))
        for ln in probe.stdout.splitlines()
        if ln.startswith("RESULT ")
    ]
    rows = [summarise_probe(r) | {"round": r["round"] + 1} for r in results]
    print(f"\nprobe: {args.rounds} rounds, {args.steps} steps of the MNIST CNN, batch 32/rank")
    print_table(rows)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--small", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--digits", type=int, default=800, help="images for the pipeline runs")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--skip-probe", action="store_true")
    parser.add_argument("--skip-pipeline", action="store_true")
    args = parser.parse_args(argv)

    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig  # noqa: PLC0415 (lazy: it loads boto3)
    from tests.cluster import netns
    from tests.cluster.spark_cluster import netns_spark_cluster

    if (reason := netns.unavailable_reason()) is not None:
        print(f"the multi-host harness cannot run here: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hvdflow-many-hosts-"))
    started = time.perf_counter()
    with netns_spark_cluster(
        work / "cluster", workers=args.hosts, cores=1, kind="bench", timeout_s=300
    ) as cluster:
        print(f"{args.hosts} hosts up in {time.perf_counter() - started:.1f} s", flush=True)
        if not args.skip_probe and probe_and_print(cluster, work, args) != 0:
            return 1
        if args.skip_pipeline:
            return 0

        services = LocalServices(work / "home")
        try:
            env = services.up(bind=cluster.driver_ip)
            make_small_images(work / "digits", args.digits)
            with temporary_env(env):
                store = ObjectStore(ObjectStoreConfig.from_env(bucket="hvdflow"))
                store.ensure_bucket()
                upload_tree(store, work / "digits", "s3://hvdflow/bench/digits/")
            pipelines = {}
            for np, kill in ((args.small, None), (args.hosts, cluster.hosts[args.hosts // 2])):
                print(
                    f"\nhvdflow run --np {np}" + (f", a rank on {kill.name} killed" if kill else "")
                )
                run = PipelineRun(cluster, work / "home", work / f"run-{np}", np, args.epochs, kill)
                code = run.finish()
                pipelines[np] = {"np": np, "exit": code, **run.figures()}
        finally:
            services.down()
    print(f"\npipeline: {args.digits} digits, {args.epochs} epochs, batch 16 per rank")
    keys = sorted({k for p in pipelines.values() for k in p}, key=list(pipelines[args.hosts]).index)
    print_table([{k: p.get(k) for k in keys} for p in pipelines.values()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
