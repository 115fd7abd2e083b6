"""Elastic training's rule, as plain values: which ranks the attempt after a failure runs on.
The real fault (a host stopped for good mid-training) is ``tests/cluster/test_elastic.py``."""

from __future__ import annotations

import pytest

from hvdflow.tasks.config import LauncherParams
from hvdflow.tasks.train.attempts import TooFewSlots, ranks_for_next_attempt, uncounted_ranks

pytestmark = pytest.mark.unit

FAILURE = "HorovodRunner np=3: rank 2 on hvd-host3 (10.77.0.13) was lost"


def next_ranks(launcher, slots_seen):
    """The rule with a cluster whose slot counts are ``slots_seen``, one per look."""
    counts = iter(slots_seen)
    last = [slots_seen[0]]

    def count():
        last[0] = next(counts, last[0])
        return last[0]

    return ranks_for_next_attempt(launcher, count, FAILURE, settle_s=0.05, sleep=lambda _: None)


def test_the_slots_left_when_at_least_min_np_and_np_once_they_are_back():
    elastic = LauncherParams(np=3, min_np=2)
    assert next_ranks(elastic, [2]) == 2
    assert next_ranks(elastic, [2, 2, 3]) == 3  # an executor came back while waiting
    assert next_ranks(elastic, [4]) == 3  # never more than np


def test_fewer_slots_than_min_np_fail_in_one_line_naming_the_failure_and_the_slots_left():
    with pytest.raises(TooFewSlots) as failure:
        next_ranks(LauncherParams(np=3, min_np=3), [2])
    message = str(failure.value)
    assert "\n" not in message and message.startswith(FAILURE)
    assert "2 task slot(s) are left" in message and "launcher.min_np=3 (np=3)" in message


@pytest.mark.parametrize(("np", "min_np"), [(2, 3), (-2, 1)])
def test_min_np_must_be_between_1_and_np_on_the_cluster(np, min_np):
    with pytest.raises(ValueError, match=f"launcher.min_np={min_np} with np={np}"):
        LauncherParams(np=np, min_np=min_np)


# Spark's barrier check refusing a stage of 3 tasks on 2 slots, as HorovodRunner's first line
# says it (through Spark Connect, in the soak of 2026-11-30).
REFUSED = (
    "HorovodRunner np=3: the Spark job that ran the 3 ranks failed: [SPARK-24819]: Barrier "
    "execution mode does not allow run a barrier stage that requires more slots than the total "
    "number of slots in the cluster currently."
)


def test_through_spark_connect_a_stage_refused_for_want_of_slots_steps_down_one_rank():
    """No SparkContext: the slots cannot be counted. After a lost host the next attempt asks for
    np again; when Spark refuses it, the one after runs on one rank fewer."""
    elastic = LauncherParams(np=3, min_np=2)
    assert uncounted_ranks(3, 3, FAILURE) == 3  # the lost host: as many as np, once more
    assert uncounted_ranks(3, 3, REFUSED) == 2
    assert next_ranks(elastic, [uncounted_ranks(3, 3, REFUSED)]) == 2
    with pytest.raises(TooFewSlots, match="1 task slot"):
        next_ranks(elastic, [uncounted_ranks(3, 2, REFUSED)])  # refused at 2 too: below min_np
