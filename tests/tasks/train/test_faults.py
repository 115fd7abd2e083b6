"""Training survives what clusters do to it: a rank SIGKILLed mid-training resumes from its
checkpoint in the same MLflow run, and a tracking server down for a minute costs no epoch."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from mlflow import MlflowClient

from hvdflow.infra.launcher import RankFailed, SparkJobFailed, _wire
from hvdflow.infra.launcher.errors import rank_failed
from hvdflow.tasks.train.attempts import may_retry
from hvdflow.tasks.train.resume import backfill_epoch_metrics
from hvdflow.tasks.train.run import TrainConfig, train_and_track
from tests.helpers import rank_of, rank_processes, wait_for_no_ranks

EPOCH_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy", "epoch_time_s")
# The tracking-server outage ends once an epoch was missed; this bounds it if none ever is.
OUTAGE_MAX_S = 120.0
# Enough epochs that some end while the server is down, however long stopping it takes.
OUTAGE_EPOCHS = 10


def kill_rank_when(text: str, rank: int = 1):
    """An on_log_line consumer that SIGKILLs ``rank``'s process the first time ``text`` shows."""
    killed = threading.Event()

    def consume(line):
        if killed.is_set() or text not in line.text:
            return
        for proc in rank_processes():
            if rank_of(proc) == rank:
                proc.send_signal(signal.SIGKILL)
                killed.set()

    return consume, killed


@pytest.mark.slow
def test_a_killed_training_resumes_from_its_checkpoint_in_the_same_run(
    spark, mlflow_server, digits_dataset, store, tmp_path
):
    checkpoints = store.config.uri(store.config.key("checkpoints"))
    training = {"epochs": 6, "batch_size": 8, "checkpoints": checkpoints}
    tracking = {"experiment": "tests-resume", "registered_model_name": "tests-resume"}
    client = MlflowClient(mlflow_server.tracking_uri)

    # 1. Rank 1 SIGKILLed in epoch 2 of 6, no retries: the training fails for good.
    consume, killed = kill_rank_when("Epoch 2/6")
    with pytest.raises(RankFailed, match="rank 1 .* was killed by SIGKILL"):
        train_and_track(
            spark,
            TrainConfig(training=training, launcher={"np": 2, "retries": 0}, tracking=tracking),
            digits_dataset,
            mlflow_server.tracking_uri,
            log_dir=str(tmp_path / "first"),
            on_log_line=consume,
        )
    assert killed.is_set()
    failed = client.search_runs(
        [client.get_experiment_by_name("tests-resume").experiment_id],
        order_by=["attributes.start_time DESC"],
    )[0]
    assert failed.info.status == "FAILED"

    # 2. `--resume` (tracking.resume='last'): the same MLflow run goes on from its checkpoint;
    # rank 1 is SIGKILLed again in epoch 4, and launcher.retries runs it once more. (Six epochs
    # of about half a second: the kill, found by a scan of the processes, lands before the end.)
    consume, killed = kill_rank_when("Epoch 4/6")
    result = train_and_track(
        spark,
        TrainConfig(
            training=training,
            launcher={"np": 2, "retries": 1},
            tracking={**tracking, "resume": "last"},
        ),
        digits_dataset,
        mlflow_server.tracking_uri,
        log_dir=str(tmp_path / "resumed"),
        on_log_line=consume,
    )
    assert killed.is_set()
    assert result.run_id == failed.info.run_id and result.attempts == 3
    for key in EPOCH_METRICS:
        steps = [m.step for m in client.get_metric_history(result.run_id, key)]
        assert sorted(steps) == [0, 1, 2, 3, 4, 5], key  # every epoch once, none twice
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["training_attempts"] == 3
    assert result.model_version is not None and result.aliases[0] == "candidate"
    assert len(result.history["loss"]) == 6 and len(result.epoch_times) == 6

    # Each attempt trained after the last checkpoint only: finished epochs were not run again.
    first_epoch = {}
    for attempt in (2, 3):
        log = client.download_artifacts(
            result.run_id, f"logs/attempt-{attempt}/driver.log", str(tmp_path / f"dl{attempt}")
        )
        text = open(log).read()
        resumed_after = int(text.split("resuming after epoch ")[1].split()[0])
        for epoch in range(1, resumed_after + 1):
            assert f"Epoch {epoch}/6" not in text
        assert f"Epoch {resumed_after + 1}/6" in text
        first_epoch[attempt] = resumed_after + 1
    assert first_epoch[2] >= 2 and first_epoch[3] >= 4
    # The newest 2 checkpoints (checkpoint_keep) are kept, and latest.json names the last.
    keys = store.list_keys(store.config.key("checkpoints", result.run_id))
    assert {k.split("/")[-2] for k in keys if k.count("/") > 3} == {"epoch-0005", "epoch-0006"}
    assert wait_for_no_ranks() == []


@pytest.mark.slow
def test_a_tracking_server_down_during_training_costs_no_epoch(
    spark, seaweed, digits_dataset, store, tmp_path
):
    from hvdflow.infra.services.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path / "mlflow", "s3://hvdflow-mlflow/outage", seaweed.env()).start()
    outage: dict[str, float] = {}
    # The server stays down until an epoch has ended without it and rank 0 has said it could
    # not log that epoch: long enough to need the buffer, no longer (at most OUTAGE_MAX_S).
    epoch_missed = threading.Event()

    def outage_until_an_epoch_is_missed():
        server.stop()
        outage["stopped"] = time.time()
        epoch_missed.wait(OUTAGE_MAX_S)
        outage["back"] = time.time()
        server.start()

    def consume(line):
        if "stopping" not in outage and f"Epoch 1/{OUTAGE_EPOCHS} done" in line.text:
            outage["stopping"] = time.time()
            threading.Thread(target=outage_until_an_epoch_is_missed, daemon=True).start()
        elif "stopping" in outage and "back" not in outage:
            # Rank 0 may say so while the server is still stopping: count it from then on.
            if "MLflow: could not log epoch" in line.text:
                outage["missed"] = line.time
            if " done in " in line.text and outage.get("stopped", line.time) < line.time:
                outage["epoch_while_down"] = line.time
            if "missed" in outage and "epoch_while_down" in outage:
                epoch_missed.set()

    lines = []
    try:
        result = train_and_track(
            spark,
            TrainConfig(
                training={"epochs": OUTAGE_EPOCHS, "batch_size": 8, "checkpoints": "off"},
                launcher={"np": 2},
                tracking={"experiment": "tests-outage", "registered_model_name": "tests-outage"},
            ),
            digits_dataset,
            server.tracking_uri,
            on_log_line=lambda line: (lines.append(line), consume(line)),
        )
        client = MlflowClient(server.tracking_uri)
        for key in EPOCH_METRICS:
            steps = [m.step for m in client.get_metric_history(result.run_id, key)]
            assert sorted(steps) == list(range(OUTAGE_EPOCHS)), key
        assert result.attempts == 1 and result.model_version is not None
    finally:
        server.stop()
    # Epochs went on while the server was down, and rank 0 said what was happening.
    done_in_outage = [
        line
        for line in lines
        if " done in " in line.text and outage["stopped"] < line.time < outage["back"]
    ]
    assert done_in_outage, "no epoch ended while the tracking server was down"
    assert epoch_missed.is_set(), f"the outage ended after {OUTAGE_MAX_S} s, not by a missed epoch"
    texts = "\n".join(line.text for line in lines)
    assert "MLflow: could not log epoch" in texts and "training goes on" in texts
    assert wait_for_no_ranks() == []


@pytest.mark.integration
def test_backfill_logs_only_the_epochs_the_run_lacks(mlflow_server):
    client = MlflowClient(mlflow_server.tracking_uri)
    experiment = client.create_experiment(f"tests-backfill-{time.time_ns()}")
    run_id = client.create_run(experiment).info.run_id
    client.log_metric(run_id, "loss", 0.9, step=0)
    client.log_metric(run_id, "loss", 0.7, step=2)
    history = {"loss": [0.9, 0.8, 0.7, 0.6], "accuracy": [0.1, 0.2, 0.3, 0.4]}
    assert backfill_epoch_metrics(mlflow_server.tracking_uri, run_id, history) == 2 + 4
    assert backfill_epoch_metrics(mlflow_server.tracking_uri, run_id, history) == 0  # idempotent
    points = {(m.step, m.value) for m in client.get_metric_history(run_id, "loss")}
    assert points == {(0, 0.9), (1, 0.8), (2, 0.7), (3, 0.6)}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("cause", "attempt", "retries", "expected"),
    [
        (_wire.CAUSE_SIGNAL, 1, 2, True),
        (_wire.CAUSE_LOST, 2, 2, True),
        (_wire.CAUSE_STALLED, 3, 2, False),  # out of retries
        (_wire.CAUSE_EXIT, 1, 2, False),  # a Python error fails the same way again
        (_wire.CAUSE_START_TIMEOUT, 1, 2, False),
        (_wire.CAUSE_SIGNAL, 1, 0, False),
    ],
)
def test_only_transient_failures_are_retried(cause, attempt, retries, expected):
    assert may_retry(rank_failed("rank 1 ...", cause), attempt, retries) is expected


@pytest.mark.unit
def test_a_lost_executor_is_retried_and_other_errors_are_not():
    lost = SparkJobFailed("the Spark job that ran the 2 ranks failed: ExecutorLostFailure")
    assert may_retry(lost, 1, 2) is True
    # The cause is a type, not a text: the same words in another error are not retried.
    assert may_retry(RuntimeError(str(lost)), 1, 2) is False
    assert may_retry(ValueError("bad input"), 1, 2) is False
    assert may_retry(RankFailed("no cause known"), 1, 2) is False
