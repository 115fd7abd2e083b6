"""Evaluations every few steps: the same subset whatever the ranks, each rank its share."""

import logging

import numpy as np
import pytest

from hvdflow.training.engines import Engine
from hvdflow.training.epoch_log import evaluations
from hvdflow.training.interval_eval import (
    IntervalEvaluation,
    eval_interval_steps,
    evaluates_after,
    subset_rows,
)


@pytest.mark.unit
def test_the_subset_is_the_same_images_for_a_seed_and_the_ranks_split_it_exactly():
    subset = subset_rows(3158, 1024, seed=0)
    assert len(subset) == 1024 and list(subset) == sorted(set(subset))
    assert list(subset) == list(subset_rows(3158, 1024, seed=0))
    assert list(subset) != list(subset_rows(3158, 1024, seed=1))
    for ranks in (1, 2, 3):
        parts = [subset[r::ranks] for r in range(ranks)]
        assert sorted(np.concatenate(parts)) == list(subset)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1  # each rank its share
    assert list(subset_rows(90, 1024, seed=0)) == list(range(90))  # a small split: all of it


@pytest.mark.unit
def test_the_interval_is_a_fraction_of_an_epoch_of_at_least_one_step():
    assert eval_interval_steps(469, 0.1) == 47
    assert eval_interval_steps(234, 0.1) == 23  # np=2 with a per-rank batch: twice as often
    assert eval_interval_steps(5, 0.1) == 1
    # Every 3 steps of a 26-step epoch, and after its last: 9 evaluations, none drifting.
    assert [s for s in range(1, 27) if evaluates_after(s, 3, 26)] == [*range(3, 25, 3), 26]
    assert [s for s in range(1, 7) if evaluates_after(s, 3, 6)] == [3, 6]


class _TwoRanksSummed(Engine):
    """Rank 0 of two whose other rank saw ``other`` (correct, images): the sum a real
    collective would give (the real ones run in tests/flows/test_benchmark.py)."""

    def __init__(self, other):
        super().__init__("test", rank=0, size=2)
        self.other = other

    def sum_over_ranks(self, values):
        return [v + o for v, o in zip(values, self.other, strict=True)]


def _always_three():
    import tensorflow as tf

    model = tf.keras.Sequential(
        [tf.keras.Input((2, 2, 1)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)]
    )
    kernel, bias = model.layers[-1].get_weights()
    bias[3] = 1.0  # every image: class 3
    model.layers[-1].set_weights([np.zeros_like(kernel), bias])
    return model


@pytest.mark.unit
@pytest.mark.parametrize(
    ("engine", "expected", "seen"),
    [(Engine("none"), 0.75, 4), (_TwoRanksSummed([0.0, 4.0]), 3 / 8, 8)],
)
def test_an_evaluation_counts_this_ranks_part_and_rank_0_logs_the_sum(
    engine, expected, seen, caplog
):
    images = np.zeros((4, 2, 2), np.uint8)  # grayscale, as stored: the channel axis is added
    labels = np.array([3, 3, 3, 1])
    callback = IntervalEvaluation(
        engine, images, labels, every_steps=2, steps_per_epoch=3, images_per_step=64
    )
    callback.set_model(_always_three())
    callback.step = 10  # where a resumed training's optimizer counter would start it
    with caplog.at_level(logging.INFO):
        callback.on_epoch_begin(0)
        for batch in range(3):  # evaluated after the second step and after the last
            callback.on_train_batch_end(batch)
    assert callback.accuracies == [(12, pytest.approx(expected)), (13, pytest.approx(expected))]
    lines = [
        type("Line", (), {"time": float(i), "text": r.getMessage()})()
        for i, r in enumerate(caplog.records)
    ]
    assert [(i, a) for _, i, a, _ in evaluations(lines)] == [
        (12 * 64, round(expected, 4)),
        (13 * 64, round(expected, 4)),
    ]
    assert f"on {seen} validation images" in caplog.records[0].getMessage()
