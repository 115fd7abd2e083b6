"""Runs a script as a Spark Connect client: a process of its own with SPARK_REMOTE set, as a
user's notebook or orchestrator worker would be (a Connect session inside the test's own process
would turn every later pyspark call there into a Connect one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# What a client script prints last: one JSON line, the test's answer.
ANSWER = "ANSWER "


def connect_client_problem() -> str | None:
    """Why this Python cannot be a Spark Connect client (None: it can). The classic profile
    cannot: TensorFlow 2.15 caps protobuf below what Connect's client needs."""
    try:
        import pyspark.sql.connect.session  # noqa: F401, PLC0415
    except ImportError as e:
        return str(e).strip().splitlines()[0]
    return None


def run_client(server, script: str, timeout_s: float = 300.0, **env: str) -> dict:
    """Run ``script`` (which ends with ``answer(value)``) against ``server``; its answer.

    Fails the test with the client's output when it exits non-zero or answers nothing.
    """
    preamble = textwrap.dedent(
        f"""
        import json, logging, os, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        def answer(value):
            print({ANSWER!r} + json.dumps(value), flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", preamble + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **server.env(), **env},
    )
    answers = [ln for ln in result.stdout.splitlines() if ln.startswith(ANSWER)]
    if result.returncode != 0 or not answers:
        raise AssertionError(
            f"the Connect client exited {result.returncode} with no answer:\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-6000:]}"
        )
    return json.loads(answers[-1][len(ANSWER) :])


JAVA_TOOLS = ("java", "javac", "jar", "jshell", "keytool", "jps", "jstack")


def path_without_java(folder) -> str:
    """A PATH of one folder with every program of this PATH but Java's (links), as on an
    orchestrator worker that never installed a JDK."""
    folder.mkdir(parents=True, exist_ok=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            link = folder / name
            if name in JAVA_TOOLS or link.exists() or link.is_symlink():
                continue
            link.symlink_to(os.path.join(directory, name))
    return str(folder)


# Tests that need Connect's client: skipped in the classic profile, run by `make test-current`.
needs_connect_client = pytest.mark.skipif(
    connect_client_problem() is not None,
    reason=f"no Spark Connect client in this profile ({connect_client_problem()}): runs in "
    "`make test-current`",
)
