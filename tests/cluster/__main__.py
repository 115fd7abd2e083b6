"""By hand: ``python -m tests.cluster up | down | status`` (as root, from the project root).

``up`` starts the cluster and keeps it until Ctrl-C (or ``down`` from another shell); ``down``
removes everything the harness created, also after a crash; ``status`` lists runs and
leftovers. ``watch TAG`` is the watchdog the harness starts itself.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.cluster import cleanup, netns, registry


def _up(args: argparse.Namespace) -> int:
    from tests.cluster.driver import write_conf_dir
    from tests.cluster.spark_cluster import netns_spark_cluster

    if reason := netns.unavailable_reason():
        print(f"cannot start: {reason}", file=sys.stderr)
        return 2
    # SIGTERM (from `down`) and SIGHUP (a closed terminal) tear down like Ctrl-C does.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hvdflow-netns-"))
    try:
        with netns_spark_cluster(
            workdir, workers=args.workers, cores=args.cores, timeout_s=args.timeout, kind="up"
        ) as cluster:
            conf_dir = write_conf_dir(cluster, workdir / "driver-conf")
            print(f"Spark master  {cluster.master_url}  (web UI {cluster.webui_url})")
            print(f"driver side   {cluster.driver_ip} (this machine's root namespace)")
            for host in cluster.hosts:
                print(f"host          {host.name}  {host.ip}  netns {host.netns}  veth {host.veth}")
            print("\nRun a driver on it from another shell (project root):")
            print(
                f"  export HVDFLOW_SPARK_MASTER={cluster.master_url} "
                f"SPARK_LOCAL_IP={cluster.driver_ip} SPARK_CONF_DIR={conf_dir}"
            )
            print("  .venv/bin/python -m hvdflow.flows.cli smoke --np 2")
            print("A shell on a host (its network, /tmp and hostname):")
            print("  " + " ".join(cluster.shell_command(cluster.hosts[0])))
            print(f"Cut / restore a host's link:  ip link set {cluster.hosts[0].veth} down|up")
            print(f"Logs: {workdir}")
            print("\nCtrl-C, or `python -m tests.cluster down`, stops it and removes everything.")
            sys.stdout.flush()
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopped; everything removed")
    return 0


def _down(args: argparse.Namespace) -> int:
    report = cleanup.down(stop_live=("up", "pytest") if args.all else ("up",))
    print("\n".join(report) if report else "nothing to remove")
    return 0


def _status(_args: argparse.Namespace) -> int:
    for record in registry.records():
        state = "running" if record.owner_alive() else "owner dead (`down` removes it)"
        owner = f"{record.kind}, pid {record.owner_pid}"
        print(f"run {record.tag} ({owner}) {record.subnet}.0/24: {state}")
    recorded = {r.tag for r in registry.records()}
    for tag, names in netns.found_names().items():
        if tag not in recorded:
            print(f"orphaned names of run {tag}: {names}")
    return 0


def _watch(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # must outlive its owner's terminal
    return cleanup.watch(args.tag)


def _interrupt(signum, _frame):
    # Once only: a second Ctrl-C must not cut the teardown short (kill -9 leaves it to the
    # watchdog).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a master and workers on simulated hosts")
    up.add_argument("--workers", type=int, default=2)
    up.add_argument("--cores", type=int, default=1)
    up.add_argument("--timeout", type=float, default=120.0, help="start timeout, seconds")
    up.add_argument("--workdir", help="logs and driver conf (default: a new temporary dir)")
    up.set_defaults(func=_up)
    down = commands.add_parser("down", help="remove what the harness created")
    down.add_argument("--all", action="store_true", help="also stop live test sessions' clusters")
    down.set_defaults(func=_down)
    commands.add_parser("status", help="list runs and leftovers").set_defaults(func=_status)
    watch = commands.add_parser("watch", help=argparse.SUPPRESS)
    watch.add_argument("tag")
    watch.set_defaults(func=_watch)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
