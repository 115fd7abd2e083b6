"""What a soak looks at, from the outside, after every run and at the end: each flow run's final
state and reason, its MLflow run's epochs, the registry's aliases, the bytes of what is in the
bucket against what was recorded, the services, and what is left running or lying in /tmp.

Each check returns problems as lines (empty: all well) or figures; none of them changes what it
looks at, except ``leftover_processes``, which kills what it finds after noting it, so that one
leak is counted once and not carried into the next run's figures.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import time
from pathlib import Path

import psutil
import requests

from hvdflow.infra.storage.access import S3Access
from hvdflow.tasks.train.registry import CONTENDER_TAG
from hvdflow.tasks.train.tags import ATTEMPTS_TAG, FLOW_RUN_TAG
from tests.helpers import RANK_ENTRY
from tests.soak import faults
from tests.soak import stack as s

CHANCE = 0.1  # ten classes


# --- one run ------------------------------------------------------------------------------------
def mlflow_of(flow_run_id, epochs: int, completed: bool) -> dict:
    """The MLflow run of a flow run (or ``<dag_id>/<run_id>``, an Airflow DAG run): epochs
    logged (each once), attempts, registered version."""
    from mlflow import MlflowClient

    client = MlflowClient()
    experiment = client.get_experiment_by_name(s.MODEL)
    if experiment is None:
        return {"problems": [] if not completed else ["no MLflow experiment"], "runs": 0}
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{FLOW_RUN_TAG}` = '{flow_run_id}'"
    )
    problems = []
    if completed and len(runs) != 1:
        problems.append(f"{len(runs)} MLflow runs for one completed flow run")
    figures = {"runs": len(runs), "versions": 0}
    for run in runs:
        # One registered version per flow run, whatever was retried inside it: a consumer of the
        # registry must never meet a version that no finished flow run owns.
        versions = client.search_model_versions(f"run_id = '{run.info.run_id}'")
        figures["versions"] += len(versions)
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")]
        if len(steps) != len(set(steps)):
            problems.append(f"MLflow run {run.info.run_id}: an epoch logged twice ({steps})")
        if completed and sorted(set(steps)) != list(range(epochs)):
            problems.append(f"MLflow run {run.info.run_id}: epochs {sorted(steps)} of {epochs}")
        figures |= {
            "mlflow_run": run.info.run_id,
            "mlflow_status": run.info.status,
            "attempts": int(run.data.tags.get(ATTEMPTS_TAG, "1")),
            "val_accuracy": run.data.metrics.get("val_accuracy"),
            "epochs_logged": len(set(steps)),
        }
    if figures["versions"] > 1 or (completed and figures["versions"] == 0):
        problems.append(f"{figures['versions']} registered versions for one flow run")
    figures["problems"] = problems
    return figures


# --- a scoring run -------------------------------------------------------------------------------
def scoring_of(store, good: int) -> dict:
    """The newest scoring run's record in MLflow, and its predictions in the bucket: every good
    image scored once (the raw tree's other objects are the bad files, quarantined)."""
    import io

    import mlflow
    import pyarrow.parquet as pq

    raw = store.list_keys(s.RAW.removeprefix("s3://hvdflow/"))
    experiment = mlflow.get_experiment_by_name("hvdflow-scoring")
    runs = mlflow.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time DESC"], output_format="list"
    )
    problems: list[str] = []
    if not runs:
        return {"problems": ["no MLflow scoring run"]}
    run = runs[0]
    scored, quarantined = run.data.metrics["images_scored"], run.data.metrics["quarantined"]
    if scored != good or scored + quarantined != len(raw):
        problems.append(
            f"scored {scored:g} and quarantined {quarantined:g} of {len(raw)} objects ({good} good)"
        )
    url = run.data.params["predictions_url"]
    keys = store.list_keys(url.removeprefix("s3://hvdflow/"))
    parts = [k for k in keys if k.endswith(".parquet")]
    rows = [pq.read_table(io.BytesIO(store.get_bytes(f"s3://hvdflow/{k}"))) for k in parts]
    sources = [source for table in rows for source in table.column("source").to_pylist()]
    if len(sources) != good or len(set(sources)) != good:
        problems.append(f"{len(sources)} predictions ({len(set(sources))} sources) for {good}")
    return {
        "scored": scored,
        "quarantined": quarantined,
        "predictions": len(sources),
        "problems": problems,
    }


# --- the registry -------------------------------------------------------------------------------
def registry_problems() -> tuple[list[str], dict]:
    """Champion on a finished run above chance and at least as good as every contender;
    every version's run finished and its model's files present."""
    from mlflow import MlflowClient

    client = MlflowClient()
    problems: list[str] = []
    versions = client.search_model_versions(f"name='{s.MODEL}'")
    if not versions:
        return problems, {"versions": 0}
    scores = {}
    for v in versions:
        run = client.get_run(v.run_id)
        if run.info.status != "FINISHED":
            problems.append(f"version {v.version}: its run {v.run_id} is {run.info.status}")
        if CONTENDER_TAG in v.tags:
            scores[v.version] = float(v.tags[CONTENDER_TAG])
        if not client.list_artifacts(v.run_id) and not _model_files(v.source):
            problems.append(f"version {v.version}: no model files at {v.source}")
    champion = client.get_model_version_by_alias(s.MODEL, "champion")
    run = client.get_run(champion.run_id)
    accuracy = run.data.metrics.get("val_accuracy", 0.0)
    if run.info.status != "FINISHED" or accuracy <= CHANCE + 0.2:
        problems.append(f"champion {champion.version}: {run.info.status}, accuracy {accuracy}")
    best = max(scores.values(), default=None)
    if best is not None and scores.get(champion.version, -1) < best:
        problems.append(f"champion {champion.version} scores below the best contender {best}")
    return problems, {"versions": len(versions), "champion": champion.version}


def _model_files(source: str) -> bool:
    from mlflow.artifacts import list_artifacts

    try:
        return bool(list_artifacts(source))
    except Exception:
        return False


# --- the bucket ---------------------------------------------------------------------------------
class Ledger:
    """What the soak recorded of the bucket's objects, to compare their bytes against later:
    each published dataset's files (their ETags when first seen), the staged weights (their
    sha256 is their name), and what the soak itself damaged, with when."""

    def __init__(self):
        self.datasets: dict[str, dict[str, str]] = {}  # attempt path -> key -> etag
        self.damaged_attempts: set[str] = set()
        self.damaged_weights: set[str] = set()

    def record_and_compare(self, store) -> tuple[list[str], dict]:
        problems = []
        client = S3Access.from_env(store.config).client()  # the listing's ETags: boto3's own
        manifests = [k for k in store.list_keys("datasets/") if k.endswith("/manifest.json")]
        current = set()
        for key in manifests:
            manifest = json.loads(store.get_bytes(f"s3://hvdflow/{key}"))
            path = manifest["path"]
            current.add(path)
            prefix = path.removeprefix("s3://hvdflow/") + "/"
            listed = client.list_objects_v2(Bucket="hvdflow", Prefix=prefix).get("Contents", [])
            etags = {o["Key"]: o["ETag"] for o in listed}
            if path in self.damaged_attempts:
                problems.append(f"dataset {path}: damaged by the soak, still published")
                continue
            seen = self.datasets.setdefault(path, etags)
            changed = sorted(k for k in seen if etags.get(k) != seen[k])
            if changed:
                problems.append(f"dataset {path}: {len(changed)} files changed or gone")
        lost = [p for p in self.datasets if p not in current and p not in self.damaged_attempts]
        # A version folder keeps one published attempt: an older one replaced is not lost
        # if its version folder still has a manifest.
        versions = {p.rsplit("/", 1)[0] for p in current}
        lost = [p for p in lost if p.rsplit("/", 1)[0] not in versions]
        problems += [f"dataset {p}: its manifest is gone" for p in lost]
        weights_bad = []
        for key in store.list_keys(store.config.key("weights") + "/"):
            name = key.rsplit("/", 1)[-1]
            digest = name.split(".", 1)[0]
            # Staged files are named by their content's sha256; the index records beside
            # them (.json) by what they were staged from.
            if name.endswith(".json") or not re.fullmatch(r"[0-9a-f]{64}", digest):
                continue
            data = store.get_bytes(f"s3://hvdflow/{key}")
            if hashlib.sha256(data).hexdigest() != digest:
                weights_bad.append(f"s3://hvdflow/{key}")
        for w in weights_bad:
            if w in self.damaged_weights:
                problems.append(f"weights {w}: damaged by the soak, still staged")
            else:
                problems.append(f"weights {w}: bytes do not match their sha256")
        self.damaged_weights &= set(weights_bad)  # staged again since: intact
        return problems, {
            "datasets": len(current),
            "weights_damaged_still_there": len(weights_bad),
        }


# --- services, processes, /tmp ------------------------------------------------------------------
def services_problems(stack) -> list[str]:
    problems = []
    urls = stack.services.urls()
    for name, path in (("s3", ""), ("mlflow", "/health"), ("prefect", "/health")):
        url = urls.get(name)
        if url is None:
            problems.append(f"{name}: not running")
            continue
        try:
            if requests.get(url + path, timeout=10).status_code >= 500:
                problems.append(f"{name}: answers with an error")
        except requests.RequestException as e:
            problems.append(f"{name}: does not answer ({type(e).__name__})")
    if stack.airflow is not None:
        try:
            health = stack.airflow.get("/api/v2/monitor/health", auth=False)
            parts = ("metadatabase", "scheduler", "dag_processor")  # no triggerer is started
            unwell = [k for k in parts if (health.get(k) or {}).get("status") != "healthy"]
            problems += [f"Airflow's {part}: not healthy" for part in unwell]
        except Exception as e:
            problems.append(f"Airflow: does not answer ({type(e).__name__})")
    return problems


def held_slots_problems() -> list[str]:
    """With no run in flight, no slot of Prefect's ``spark-slots`` limit may be held: one that
    is would make every later training wait for ever."""
    from prefect.client.orchestration import get_client

    from hvdflow.flows.prefect.spark_slots import SPARK_SLOTS

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(SPARK_SLOTS)
    if limit.active_slots:
        return [f"{SPARK_SLOTS}: {limit.active_slots} of {limit.limit} held, no run in flight"]
    return []


def leftover_processes(stack) -> list[str]:
    """Ranks, executors, drivers and flow-run processes when no run is in flight: there must be
    none besides the worker, and the Spark Connect server's while it runs. Each found is noted,
    then killed."""
    connect = stack.connect_pids()
    found = {p.pid: f"rank {p.pid}" for p in faults.in_hosts(stack, RANK_ENTRY)}
    found |= {
        p.pid: f"executor {p.pid}"
        for p in faults.in_hosts(stack, faults.EXECUTOR_MAIN)
        if p.pid not in connect
    }
    worker = stack.worker.pid if stack.worker else None
    mine = {os.getpid()}
    for proc in s.processes_with_env("HVDFLOW_HOME", str(stack.home)):
        if proc.pid == worker or proc.pid in mine:
            continue
        try:
            cmdline = " ".join(proc.cmdline()[:4])
        except psutil.Error:
            continue
        found.setdefault(proc.pid, f"process {proc.pid} ({cmdline[:80]})")
    # Services are started with the home's path in their command, not in their environment.
    services = {info["pid"] for info in stack.services.state().values()}
    lines = []
    for pid, line in found.items():
        if pid in services or _is_service_child(pid, services) or _airflow_own(stack, pid):
            continue
        if pid in connect:
            continue
        lines.append(line)
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    return lines


def _airflow_own(stack, pid: int) -> bool:
    """Whether ``pid`` is Airflow's own (its components, their executor's workers, the tasks'
    supervisors: Airflow's interpreter), which live as long as the soak's Airflow; the tasks'
    hvdflow Pythons and their JVMs are not."""
    if stack.airflow is None:
        return False
    try:
        first = (psutil.Process(pid).cmdline() or [""])[0]
    except psutil.Error:
        return False
    # Its interpreter is a link to the same Python as hvdflow's: told apart by the path it
    # was started as, or by the title Airflow gives its forked processes.
    return first.startswith((str(stack.airflow.command.parent), "airflow"))


def _is_service_child(pid: int, services: set[int]) -> bool:
    try:
        return os.getpgid(pid) in services
    except OSError:
        return False


def wait_for_no_leftovers(stack, settle_s: float = 30.0) -> list[str]:
    """Leftovers once they had ``settle_s`` to end by themselves (executors end after their
    driver within seconds)."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        if not _any_left(stack):
            return []
        time.sleep(1)
    return leftover_processes(stack)


def _any_left(stack) -> bool:
    connect = stack.connect_pids()
    if faults.in_hosts(stack, RANK_ENTRY):
        return True
    if any(p.pid not in connect for p in faults.in_hosts(stack, faults.EXECUTOR_MAIN)):
        return True
    worker = stack.worker.pid if stack.worker else None
    services = {info["pid"] for info in stack.services.state().values()}
    return any(
        p.pid not in (worker, os.getpid(), *connect)
        and not _is_service_child(p.pid, services)
        and not _airflow_own(stack, p.pid)
        for p in s.processes_with_env("HVDFLOW_HOME", str(stack.home))
    )


# A JVM's perf-data file (HotSpot writes it in /tmp whatever java.io.tmpdir says): a live JVM's
# own, or a killed one's, which HotSpot removes when the next JVM starts on the host (checked on
# this machine: kill -9, then any java). Listed apart; not a leftover.
JVM_PERF_FILE = re.compile(r"^/tmp/hsperfdata_[^/]+/(\d+)$")


def host_tmp(stack) -> dict[str, dict]:
    """Each host's /tmp: files beside Spark's work dir (its executors' logs and what their JVMs
    unpacked, kept by Spark's design), JVMs' perf-data files apart, and the bytes used."""
    out = {}
    for host in stack.cluster.hosts + stack.cluster.spare_hosts:
        done = stack.cluster.run_on_host(
            host,
            "find /tmp -xdev -path /tmp/work -prune -o -type f -print | grep -v '^/tmp/home/' ;"
            " echo USED $(du -sk --exclude=/tmp/work /tmp | cut -f1)"
            " WORK $(du -sk /tmp/work | cut -f1)",
        )
        lines = done.stdout.splitlines()
        used = next((ln for ln in lines if ln.startswith("USED")), "USED 0 WORK 0").split()
        files = [ln for ln in lines if not ln.startswith("USED")]
        perf = [f for f in files if JVM_PERF_FILE.match(f)]
        out[host.name] = {
            "files": [f for f in files if f not in perf],
            # A host lost for good is a dead machine: its disk, and what lies on it, went with
            # it (a replacement starts empty: tests.soak.faults.replace_lost_host).
            "lost_for_good": host.name in stack.lost_for_good,
            "jvm_perf_files": perf,
            "kib": int(used[1]),
            "work_kib": int(used[3]) if len(used) > 3 else 0,
        }
    return out


# Folders in /tmp that the stack's programs share, one entry per process or run: Prefect's
# workers' runner storage (Prefect 3.8 leaves each worker's, even a cleanly stopped one's),
# TensorBoard's and torch's.
# Their entries are looked at one by one: the folders themselves were there before the soak.
SHARED_TMP_FOLDERS = ("runner_storage", ".tensorboard-info", "torchinductor_*")


def root_tmp_entries(exclude: tuple[Path, ...]) -> set[str]:
    """Names in this machine's /tmp, and in its SHARED_TMP_FOLDERS, less the soak's own
    folders and JVMs' perf-data files (JVM_PERF_FILE)."""
    names = set(os.listdir("/tmp"))
    for folder in names & {
        f for pattern in SHARED_TMP_FOLDERS for f in fnmatch.filter(names, pattern)
    }:
        with contextlib.suppress(OSError):  # gone meanwhile, or not a folder
            names |= {f"{folder}/{child}" for child in os.listdir(Path("/tmp", folder))}
    return {
        n
        for n in names
        if not any(Path("/tmp", n) in (e, *e.parents) for e in exclude)
        and not JVM_PERF_FILE.match(f"/tmp/{n}")
    }
