"""The three launcher faces through Spark Connect: a session made by
``SparkSession.builder.remote(...)``, against a real Connect server on local[2] (the
``connect_server`` fixture), each function run unchanged and rank 0's value returned.

The client runs in a process of its own (tests/connect_client.py). Connect's client needs
protobuf 5 or newer, which the classic profile's TensorFlow 2.15 caps below: these tests run in
the current profile (`make test-current`)."""

from __future__ import annotations

import re

import pytest

from tests.connect_client import needs_connect_client, run_client

pytestmark = [
    pytest.mark.integration,
    pytest.mark.current,
    needs_connect_client,
]

SESSION = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(os.environ["SPARK_REMOTE"]).getOrCreate()
"""


def test_a_horovod_runner_returns_rank_0s_value_in_pieces_and_logs_both_ranks(
    connect_server, store
):
    # Through the object store relay alone, as from a client no executor can connect to: the
    # lines come that way, the value in Arrow rows through Connect as always.
    answer = run_client(
        connect_server,
        SESSION
        + """
from hvdflow import HorovodRunner, LaunchOptions

def main(size):
    import os
    rank = int(os.environ["HOROVOD_RANK"])
    print(f"hello from rank {rank}", flush=True)
    return {"rank": rank, "payload": bytes([rank + 1]) * size}

runner = HorovodRunner(np=2, options=LaunchOptions(engine="tf_collective", relay="always"))
result = runner.run(main, size=3_000_000)  # three pieces of rank 0's result, and a bit
with open(runner.log_path) as f:
    log = f.read()
answer({"rank": result["rank"], "payload": len(result["payload"]),
        "first": result["payload"][0], "log": log})
""",
        HVDFLOW_BUCKET=store.config.bucket,
        HVDFLOW_PREFIX=store.config.prefix,
    )
    assert answer["rank"] == 0 and answer["first"] == 1
    assert answer["payload"] == 3_000_000
    assert "hello from rank 0" in answer["log"] and "hello from rank 1" in answer["log"]
    assert store.list_keys(store.config.key("relay") + "/") == []  # every mailbox removed


def test_mirrored_strategy_and_torch_distributor_functions_run_unchanged(connect_server):
    answer = run_client(
        connect_server,
        SESSION
        + """
from hvdflow import MirroredStrategyRunner, TorchDistributor

def train():  # as in spark-tensorflow-distributor's README: the runner made the strategy
    import json, os
    import numpy as np
    import tensorflow as tf
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    return {"task": task, "losses": history.history["loss"]}

mirrored = MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train)

def torch_main(label):  # what TorchDistributor sets, read as torchrun's processes read it
    import os
    return {"label": label, "rank": int(os.environ["RANK"]),
            "world": int(os.environ["WORLD_SIZE"])}

torch = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(torch_main, "t")
answer({"mirrored": mirrored, "torch": torch})
""",
    )
    mirrored, torch = answer["mirrored"], answer["torch"]
    assert mirrored["task"] == 0
    assert mirrored["losses"][-1] < mirrored["losses"][0]  # it trained
    assert torch == {"label": "t", "rank": 0, "world": 2}


def test_a_failing_rank_is_named_and_the_stage_ends(connect_server):
    answer = run_client(
        connect_server,
        SESSION
        + """
import time
from hvdflow import HorovodRunner, LaunchOptions, RankFailed

def main():
    import os
    if os.environ["HOROVOD_RANK"] == "1":
        raise ValueError("rank one cannot go on")
    time.sleep(600)  # rank 0 would wait for ever: the launcher must stop it

try:  # returns long before rank 0's sleep ends (run_client's timeout would fail the test)
    HorovodRunner(np=2, options=LaunchOptions(engine="tf_collective")).run(main)
    answer({"error": None})
except RankFailed as e:
    answer({"error": str(e)})
""",
    )
    assert "rank 1" in answer["error"].splitlines()[0], answer["error"]
    assert "rank one cannot go on" in answer["error"]


def test_a_long_stage_is_logged_from_connects_progress_handler(connect_server):
    answer = run_client(
        connect_server,
        SESSION
        + """
import time
from hvdflow.infra.spark import SparkProgress

class Lines:
    def __init__(self):
        self.lines = []

    def info(self, fmt, *args):
        self.lines.append(fmt % args)

def slow(batches):
    import time
    for batch in batches:
        time.sleep(1.5)
        yield batch

log = Lines()
with SparkProgress(spark, log, every_s=0.3):
    spark.range(0, 6, 1, numPartitions=6).mapInArrow(slow, "id long").collect()
    time.sleep(1.0)  # one more look after the stage
answer(log.lines)
""",
    )
    assert any(
        re.match(r"Spark stage \d+ \(through Spark Connect\): \d+/6 tasks", line) for line in answer
    ), answer
