"""A rank whose TensorFlow server finds its port taken (by another program, between the
launcher's pick and the listen): a TransientError, so the training step runs another attempt
instead of failing (seen once in CI: "Could not start gRPC server", errno 98)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.current]

START = """
from hvdflow.infra.errors import TransientError
from hvdflow.training.engines import start_engine
try:
    start_engine("tf_collective")
except TransientError as e:
    print("TransientError:", e)
"""


def test_a_taken_port_ends_the_attempt_as_transient_naming_the_address():
    pytest.importorskip("tensorflow")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = {
            "cluster": {"worker": [f"127.0.0.1:{port}"]},
            "task": {"type": "worker", "index": 0},
        }
        env = os.environ | {"TF_CONFIG": json.dumps(config), "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run(
            [sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=180
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"TransientError: TensorFlow could not listen on 127.0.0.1:{port}" in done.stdout
