"""The soak's table (docs/benchmarks/cluster.md, "Soak") and its JSON record."""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict

from tests.soak.plan import FAULT_KINDS


def table(records, idle) -> str:
    rows = [
        "| fault | injected | finished without a person | failed with a reason | "
        "epochs recomputed | lost or corrupted | recovery (median s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in [None, *FAULT_KINDS]:
        mine = [r for r in records if r.planned.fault == kind]
        if not mine:
            continue
        struck = [r for r in mine if r.strike.get("began")] if kind else mine
        completed = sum(r.outcome.get("state") == "COMPLETED" for r in mine)
        failed = [r for r in mine if r.outcome.get("state") != "COMPLETED"]
        with_reason = sum(bool(r.outcome.get("reason")) for r in failed)
        recomputed = sum(r.outcome.get("epochs_recomputed", 0) for r in mine)
        lost = sum(len(r.problems) for r in mine)
        recovery = [r.recovered_s for r in mine if r.recovered_s is not None]
        rows.append(
            f"| {kind or 'none'} | {len(struck)} of {len(mine)} runs | {completed} | "
            f"{with_reason} of {len(failed)} | {recomputed} | {lost} | "
            f"{statistics.median(recovery):.1f} |"
            if recovery
            else f"| {kind or 'none'} | {len(struck)} of {len(mine)} runs | {completed} | "
            f"{with_reason} of {len(failed)} | {recomputed} | {lost} | - |"
        )
    return "\n".join(rows)


def faces_table(records) -> str:
    """Runs, completed runs and registered versions by profile, orchestrator, framework and
    how the run reached Spark."""
    rows = [
        "| profile | orchestrator | framework | Spark | runs | completed | versions |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, row in by_face(records).items():
        profile, face, framework, spark = key.split("/")
        rows.append(
            f"| {profile} | {face} | {framework} | {spark} | {row['runs']} | "
            f"{row['completed']} | {row['versions']} |"
        )
    return "\n".join(rows)


def summary(records, idle) -> dict:
    problems = [p for r in records for p in r.problems] + [p for c in idle for p in c.problems]
    leftovers = [x for c in idle for x in c.leftovers]
    failed = [r for r in records if r.outcome.get("state") != "COMPLETED"]
    return {
        "runs": len(records),
        "completed": len(records) - len(failed),
        "failed_with_reason": sum(bool(r.outcome.get("reason")) for r in failed),
        "failed_without_reason": sum(not r.outcome.get("reason") for r in failed),
        "problems": problems,
        "leftover_processes": leftovers,
        "reasons": {r.planned.index: r.outcome.get("reason") for r in failed},
        "epochs_recomputed": sum(r.outcome.get("epochs_recomputed", 0) for r in records),
        # Flow runs by how many model versions they registered: every completed run exactly one.
        "versions_per_run": _versions_per_run(records),
        "tmp_at_end": tmp_at_end(idle),
        "by_face": by_face(records),
        "burst_overlaps": burst_overlaps(records),
    }


def by_face(records) -> dict[str, dict]:
    """Runs, completed runs and registered versions per profile, orchestrator, framework and
    Spark: ``connect`` (a Spark Connect server) or ``driver`` (the run's own)."""
    out: dict[str, dict] = {}
    for r in records:
        spark = "connect" if r.planned.connect else "driver"
        key = f"{r.planned.profile}/{r.planned.face}/{r.planned.framework}/{spark}"
        row = out.setdefault(key, {"runs": 0, "completed": 0, "versions": 0})
        row["runs"] += 1
        row["completed"] += r.outcome.get("state") == "COMPLETED"
        row["versions"] += r.mlflow.get("versions", 0)
    return out


def burst_overlaps(records) -> list[str]:
    """Runs of one burst (one orchestrator's) that ran at the same time: each orchestrator
    must run them in turn (the deployment's concurrency limit, the DAG's max_active_runs)."""
    found = []
    for face in {r.planned.face for r in records if r.planned.burst}:
        windows = sorted(
            (r.outcome["window"], r.planned.index)
            for r in records
            if r.planned.burst and r.planned.face == face and "window" in r.outcome
        )
        for (first, i), (second, j) in zip(windows, windows[1:], strict=False):
            if second[0] < first[1] - 1.0:  # a second of slack for the clocks' rounding
                found.append(f"{face}: runs {i} and {j} overlapped")
    return found


def _versions_per_run(records) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        ended = "completed" if r.outcome.get("state") == "COMPLETED" else "not completed"
        key = f"{r.mlflow.get('versions', 0)} ({ended})"
        counts[key] = counts.get(key, 0) + 1
    return counts


def tmp_at_end(idle) -> dict:
    return _tmp(idle[-1]) if idle else {}


def _tmp(check) -> dict:
    """What the last check found in /tmp: the hosts' files beside Spark's work dir (by name
    pattern), their growth, and new entries in this machine's /tmp."""
    names: dict[str, int] = {}
    on_lost: dict[str, int] = {}
    hosts = check.figures.get("hosts", {}).values()
    for host in hosts:
        counted = on_lost if host.get("lost_for_good") else names
        for path in host["files"]:
            pattern = re.sub(r"[0-9a-f]{6,}|\d+", "N", path.rsplit("/", 1)[-1])
            counted[pattern] = counted.get(pattern, 0) + 1
    root_new = check.figures.get("root_tmp_new", [])
    return {
        # What #55 asks to be 0: files the hosts' /tmp keeps beside Spark's work dir, and new
        # entries in this machine's /tmp.
        "files_left": sum(names.values()) + len(root_new),
        "host_files_by_pattern": names,
        # On a host lost for good and not replaced since: a dead machine's disk.
        "lost_host_files_by_pattern": on_lost,
        # Listed apart (tests.soak.checks.JVM_PERF_FILE): HotSpot's perf-data files.
        "host_jvm_perf_files": sum(len(h.get("jvm_perf_files", [])) for h in hosts),
        "host_tmp_growth_kib": check.figures.get("host_tmp_growth_kib"),
        "host_work_kib": sum(h["work_kib"] for h in check.figures.get("hosts", {}).values()),
        "root_tmp_new": root_new,
        # Listed apart: Prefect workers' runner folders (tests.soak.stack.RUNNER_STORAGE), the
        # live worker's in use, a SIGKILLed or stopped one's left by Prefect itself (3.8 leaves
        # it even when its worker stops cleanly).
        "worker_folders": check.figures.get("worker_folders", {}),
    }


def as_json(records, idle, meta: dict, made: dict | None = None) -> dict:
    """``made``: the summary, when the caller added to it."""
    return {
        **meta,
        "summary": made or summary(records, idle),
        "runs": [asdict(r) for r in records],
        "idle_checks": [asdict(c) for c in idle],
    }
