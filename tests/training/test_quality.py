"""The publishing guard's verdicts, with exact values (``hvdflow.training.quality``)."""

import math

import pytest

from hvdflow.training.quality import CHANCE_MARGIN, divergence, rejection

RATE = "0.02 (0.01 x 2 ranks, lr_scaling 'linear'; no warm-up)"


@pytest.mark.unit
def test_the_reported_failure_is_caught_after_its_first_epoch():
    # np=2, Adam at 0.01 scaled linearly: loss 3.10 after epoch 1, val_accuracy 0.11.
    reason = divergence(1, {"loss": 3.10, "val_accuracy": 0.11}, 10, RATE)
    assert reason == (
        "training diverged in epoch 1 with learning rate 0.02 (0.01 x 2 ranks, lr_scaling "
        "'linear'; no warm-up): loss 3.100 is worse than guessing all 10 classes alike (2.303) "
        "by more than 1.25x; lower training.learning_rate, lengthen training.warmup_epochs, or "
        "set training.lr_scaling='sqrt' (or 'none')"
    )


@pytest.mark.unit
@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_a_loss_that_is_not_a_number_diverged(loss):
    assert divergence(3, {"loss": loss}, 10).startswith(
        f"training diverged in epoch 3: the loss is {loss}"
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "logs",
    [
        {"loss": 2.30},  # a slow start at about a uniform guess: not diverged
        {"loss": 0.4, "val_accuracy": 0.9},
        {"val_accuracy": 0.1},  # no loss: nothing to judge
    ],
)
def test_learning_or_starting_slowly_is_not_divergence(logs):
    assert divergence(1, logs, 10) is None


@pytest.mark.unit
def test_a_model_no_better_than_chance_is_rejected_naming_the_numbers():
    history = {"loss": [2.4, 2.3], "val_accuracy": [0.11, 0.14]}
    reason = rejection(history, 10, CHANCE_MARGIN, RATE)
    assert reason.startswith(
        "final val_accuracy 0.140 is no better than chance (0.100 for 10 classes, plus a margin "
        "of 0.05): the model trained with learning rate 0.02 (0.01 x 2 ranks"
    )
    assert "training.epochs" in reason
    # Just above chance plus the margin passes; two classes have their own chance.
    assert rejection({"val_accuracy": [0.151]}, 10) is None
    assert rejection({"val_accuracy": [0.54]}, 2) is not None
    assert rejection({"val_accuracy": [0.56]}, 2) is None


@pytest.mark.unit
def test_a_good_accuracy_with_a_nan_loss_is_still_rejected():
    reason = rejection({"loss": [0.3, math.nan], "val_accuracy": [0.9, 0.95]}, 10)
    assert reason.startswith("the final loss is nan: the training diverged")


@pytest.mark.unit
def test_without_validation_the_training_accuracy_is_judged_and_without_either_nothing():
    assert rejection({"accuracy": [0.05]}, 10).startswith("final accuracy 0.050")
    assert rejection({"loss": [0.3]}, 10) is None
