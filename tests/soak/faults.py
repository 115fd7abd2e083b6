"""The hands that break things: one function per fault kind, each doing it for real (a signal,
an unplugged link, a capped disk, changed bytes in the bucket) and saying what it did.

Every function takes the stack and the planned run's ``detail`` and returns a record: what was
struck, and when the fault began and ended (epoch seconds). ``prepare`` does what a kind needs
before its run is asked for (a spare host's worker, new images to preprocess).
"""

from __future__ import annotations

import hashlib
import json
import signal
import time

import psutil

from tests.cluster.spark_cluster import _net_inode
from tests.helpers import RANK_ENTRY
from tests.soak import stack as s

EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
SERVICE_DOWN_S = 20.0
# What a strike that found nothing to break says first: the soak's table does not count it as
# injected (the mixed soak of 2026-11-30 counted a weights_altered that found no weights).
NOT_STRUCK = "not struck: "
DISK_FULL_S = 15.0


def in_hosts(stack, marker: str) -> list[psutil.Process]:
    inodes = set(stack.cluster.netns_inodes.values())
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []) and _net_inode(proc.pid) in inodes:
                found.append(proc)
        except psutil.Error:
            continue
    return sorted(found, key=lambda p: p.pid)


def _kill_one(stack, marker: str, which: int, what: str) -> dict:
    found = in_hosts(stack, marker)
    if not found:
        return {"struck": f"{NOT_STRUCK}no {what} was running"}
    victim = found[which % len(found)]
    victim.send_signal(signal.SIGKILL)
    return {"struck": f"{what} pid {victim.pid} SIGKILLed"}


def rank_kill(stack, detail: dict) -> dict:
    return _kill_one(stack, RANK_ENTRY, detail["rank"], "rank")


def executor_kill(stack, detail: dict) -> dict:
    return _kill_one(stack, EXECUTOR_MAIN, detail["rank"], "executor")


def host_lost(stack, detail: dict) -> dict:
    (spare,) = stack.cluster.spare_hosts
    killed = stack.cluster.stop_host_for_good(spare)
    stack.lost_for_good.add(spare.name)
    return {"struck": f"{spare.name} lost for good ({len(killed)} processes SIGKILLed)"}


# A machine that replaces a lost one starts with an empty disk: everything in the host's private
# folders goes but the three the harness made for it (emptied), and never a mount point (the
# checkout and its environments may be mounted under them: tests.cluster.netns).
_FRESH_DISK = (
    "set -e; keep='! -path /tmp/home ! -path /tmp/work ! -path /tmp/spark-local';"
    " for d in /tmp /var/tmp /dev/shm /tmp/home /tmp/work /tmp/spark-local; do"
    " find $d -xdev -mindepth 1 -maxdepth 1 $keep ! -exec mountpoint -q {} \\;"
    " -exec rm -rf --one-file-system {} +; done"
)


def replace_lost_host(stack, host) -> None:
    """The spare host back as a new machine: a fresh disk, then its worker."""
    if host.name in stack.lost_for_good:
        done = stack.cluster.run_on_host(host, _FRESH_DISK)
        if done.returncode != 0:
            raise RuntimeError(f"{host.name}: its disk could not be emptied: {done.stderr[-500:]}")
        stack.lost_for_good.discard(host.name)
    stack.cluster.start_worker(host)


def link_cut(stack, detail: dict) -> dict:
    host = stack.cluster.hosts[detail["host"]]
    stack.cluster.cut_link(host)
    try:
        time.sleep(detail["seconds"])
    finally:
        stack.cluster.restore_link(host)
    return {"struck": f"{host.name}'s link cut for {detail['seconds']} s"}


def _restart(stack, name: str, down_s: float) -> dict:
    stack.kill_service(name)
    time.sleep(down_s)
    began = time.time()
    stack.start_services()
    return {"struck": f"{name} killed, back after {down_s + time.time() - began:.1f} s"}


def mlflow_restart(stack, detail: dict) -> dict:
    return _restart(stack, "mlflow", SERVICE_DOWN_S)


def s3_restart(stack, detail: dict) -> dict:
    return _restart(stack, "s3", SERVICE_DOWN_S)


def prefect_restart(stack, detail: dict) -> dict:
    return _restart(stack, "prefect", 0.0)


def worker_kill(stack, detail: dict) -> dict:
    old = stack.worker.pid
    stack.kill_worker()
    stack.start_worker()
    return {"struck": f"worker pid {old} SIGKILLed, worker {stack.workers_started} started"}


def scheduler_kill(stack, detail: dict) -> dict:
    """Airflow's scheduler SIGKILLed with its process group (its LocalExecutor's workers and
    the tasks they supervise, as when its container or service unit dies), started again."""
    killed = stack.airflow.kill_component("scheduler")
    stack.airflow.start_component("scheduler")
    return {"struck": f"scheduler SIGKILLed with its group ({killed} processes), started again"}


def api_server_kill(stack, detail: dict) -> dict:
    """Airflow's API server SIGKILLed with its process group and started again after
    SERVICE_DOWN_S. It serves the Execution API too: the running `train` task's supervisor
    loses its heartbeat and state calls meanwhile."""
    killed = stack.airflow.kill_component("api-server")
    time.sleep(SERVICE_DOWN_S)
    began = time.time()
    stack.airflow.start_component("api-server")
    stack.airflow.wait_healthy()
    return {
        "struck": f"API server SIGKILLed with its group ({killed} processes), "
        f"back after {SERVICE_DOWN_S + time.time() - began:.1f} s"
    }


def disk_full(stack, detail: dict) -> dict:
    """Every worker host's /tmp (a tmpfs) capped at what it holds, for DISK_FULL_S from an
    epoch's start: the epoch's end, where rank 0 writes its checkpoint into its temporary
    folder before uploading it, meets a full disk."""
    hosts = stack.cluster.hosts[:2]
    sizes = {}
    try:
        for host in hosts:
            df = stack.cluster.run_on_host(host, "df -B1K --output=size,used /tmp | tail -1")
            size, used = df.stdout.split()
            capped = stack.cluster.run_on_host(host, f"mount -o remount,size={int(used) + 4}k /tmp")
            if capped.returncode != 0:  # the soak's own failure (Soak.strike notes it)
                raise RuntimeError(f"could not cap {host.name}'s /tmp: {capped.stderr.strip()}")
            sizes[host] = size
        time.sleep(DISK_FULL_S)
    finally:
        for host, size in sizes.items():
            stack.cluster.run_on_host(host, f"mount -o remount,size={size}k /tmp")
    names = " and ".join(h.name for h in hosts)
    return {"struck": f"{names}: /tmp full for {DISK_FULL_S:g} s"}


def weights_altered(stack, detail: dict) -> dict:
    store = stack.store()
    staged = [
        k for k in store.list_keys(store.config.key("weights") + "/") if not k.endswith(".json")
    ]
    if not staged:
        return {"struck": f"{NOT_STRUCK}no staged weights yet"}
    key = staged[-1]
    uri = f"s3://hvdflow/{key}"
    data = store.get_bytes(uri)
    if detail["how"] == "truncate":
        bad = data[: len(data) // 2]
    else:
        middle = len(data) // 2
        bad = (
            data[:middle]
            + bytes(b ^ 0xFF for b in data[middle : middle + 64])
            + data[middle + 64 :]
        )
    store.put_bytes(bad, uri, "application/octet-stream")
    done = "truncated to half" if detail["how"] == "truncate" else "64 bytes inverted"
    return {"struck": f"{uri}: {done}", "uri": uri}


def row_group_corrupt(stack, detail: dict) -> dict:
    store = stack.store()
    newest = current_dataset(store)
    if newest is None:
        return {"struck": f"{NOT_STRUCK}no published dataset yet"}
    attempt = newest["path"].removeprefix("s3://hvdflow/")
    parts = [k for k in store.list_keys(attempt + "/train/") if k.endswith(".parquet")]
    key = parts[0]
    data = store.get_bytes(f"s3://hvdflow/{key}")
    at = int(len(data) * detail["offset"])
    bad = data[:at] + bytes(b ^ 0x5A for b in data[at : at + 32]) + data[at + 32 :]
    store.put_bytes(bad, f"s3://hvdflow/{key}", "application/octet-stream")
    return {"struck": f"32 bytes of s3://hvdflow/{key} changed", "attempt": newest["path"]}


def broken_images(stack, detail: dict, index: int = 0) -> dict:
    store = stack.store()
    for i in range(detail["count"]):
        name = f"{s.RAW}{i % 10}/broken-{index:03d}-{i}.png"
        store.put_bytes(b"\x89PNG\r\n\x1a\n" + hashlib.sha256(name.encode()).digest(), name)
    return {"struck": f"{detail['count']} broken images added", "added_bad": detail["count"]}


def current_dataset(store) -> dict | None:
    """The newest manifest under the datasets prefix (the one runs read now)."""
    manifests = [k for k in store.list_keys("datasets/") if k.endswith("/manifest.json")]
    records = [json.loads(store.get_bytes(f"s3://hvdflow/{k}")) for k in manifests]
    return max(records, key=lambda r: r["created_at"], default=None)


def container_kill(stack, detail: dict) -> dict:
    name = stack.container_worker
    if name is None:
        return {"struck": f"{NOT_STRUCK}no worker container was running"}
    stack.docker("kill", name)
    killed_at = time.time()
    stack.docker("start", name)  # as a restart policy or an orchestrator would
    stack.wait_for_container_worker()
    return {"struck": f"{name} docker-killed, back in {time.time() - killed_at:.1f} s"}


STRIKES = {
    "rank_kill": rank_kill,
    "executor_kill": executor_kill,
    "host_lost": host_lost,
    "link_cut": link_cut,
    "mlflow_restart": mlflow_restart,
    "s3_restart": s3_restart,
    "prefect_restart": prefect_restart,
    "worker_kill": worker_kill,
    "scheduler_kill": scheduler_kill,
    "api_server_kill": api_server_kill,
    "disk_full": disk_full,
    "container_kill": container_kill,
    "weights_altered": weights_altered,
    "row_group_corrupt": row_group_corrupt,
    "broken_images": broken_images,
}


def prepare(stack, fault: str | None, index: int) -> dict:
    """What a run's fault needs before it is asked for."""
    if fault != "container_kill":
        stack.remove_container_worker()  # it served the run before only
    if fault == "container_kill":
        # Three slots, one of them in the container: np=3 puts a rank there for sure.
        (spare,) = stack.cluster.spare_hosts
        if spare.ip in {w["host"] for w in stack.cluster.alive_workers()}:
            host_lost(stack, {})  # the next host_lost run brings it back as a new machine
        stack.start_container_worker()
        return {"np": 3}
    if fault == "host_lost":
        (spare,) = stack.cluster.spare_hosts
        if spare.ip not in {w["host"] for w in stack.cluster.alive_workers()}:
            replace_lost_host(stack, spare)  # it joins; this run loses it for good
        return {"np": 3, "min_np": 2}
    return {}
