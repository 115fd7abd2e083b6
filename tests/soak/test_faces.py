"""How the soak reads an Airflow task's log: the rank lines that an error quotes are not epochs
begun again (Airflow logs a multi-line error one line an event)."""

from __future__ import annotations

import pytest

from tests.soak.faces import epochs_of, log_line, without_error_tails

pytestmark = pytest.mark.unit


def test_the_rank_lines_an_error_quotes_are_not_counted_as_epochs_begun():
    log = [
        "[1,0]<log>:Epoch 1/3",
        "[1,0]<log>:Epoch 2/3",
        "WARNING hvdflow.tasks.train.attempts: training attempt 1 of 3 failed (rank 0 exited "
        "with code 75: DiskFullError). Last lines of its output:",
        "[1,0]<log>:Epoch 1/3",
        "[1,0]<log>:Epoch 2/3",
        "[1,0]<stderr>:DiskFullError: checkpoint epoch-0002 could not be written",
        "WARNING hvdflow.tasks.train.attempts: attempt 2 waits 15 s",
        "[1,0]<log>:resuming after epoch 1 from the checkpoint at s3://b/c/epoch-0001",
        "[1,0]<log>:Epoch 2/3",
        "[1,0]<log>:Epoch 3/3",
    ]
    assert epochs_of(log) == {"epochs_begun": 6, "epochs_recomputed": 3}
    assert epochs_of(without_error_tails(log)) == {"epochs_begun": 4, "epochs_recomputed": 1}


def test_airflow_task_log_lines_are_read_as_their_event(tmp_path):
    task_log = tmp_path / "dag_id=d" / "run_id=r" / "task_id=train" / "attempt=1.log"
    event = '{"timestamp": "2026-11-29T08:59:31Z", "event": "[1,0]<log>:Epoch 1/6"}'
    assert log_line(task_log, event) == "[1,0]<log>:Epoch 1/6"
    assert log_line(tmp_path / "worker-1.log", event) == event  # a Prefect worker's: as written
