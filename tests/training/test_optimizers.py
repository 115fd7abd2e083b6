import math

import pytest

from hvdflow.training.optimizers import (
    LearningRatePlan,
    learning_rate_plan,
    rank_batch_size,
    resolve_scaling,
    scaled_learning_rate,
)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["adadelta", "rmsprop", "adam", "radam", "sgd"])
def test_the_papers_optimizers_build(name):
    from hvdflow.infra import extras
    from hvdflow.training.optimizers import make_optimizer

    if name == "radam" and not extras.installed(extras.ADDONS):  # the current profile
        with pytest.raises(extras.MissingExtra, match=r"hvdflow\[addons\]"):
            make_optimizer(name, 0.01)
        return
    optimizer = make_optimizer(name, 0.01)
    assert float(optimizer.learning_rate) == pytest.approx(0.01)
    if name == "radam":
        assert type(optimizer).__name__ == "RectifiedAdam"
    if name == "sgd":
        assert float(optimizer.momentum) == pytest.approx(0.9)  # Goyal et al.'s SGD


@pytest.mark.unit
def test_an_unknown_optimizer_names_the_choices():
    from hvdflow.training.optimizers import make_optimizer

    with pytest.raises(ValueError, match="optimizer 'nope' is unknown: expected one of"):
        make_optimizer("nope", 0.01)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("optimizer", "rule"),
    [
        ("sgd", "linear"),
        ("adadelta", "linear"),
        ("adam", "sqrt"),
        ("radam", "sqrt"),
        ("rmsprop", "sqrt"),
        ("Adam", "sqrt"),
    ],
)
def test_auto_scales_sgd_like_optimizers_linearly_and_adam_like_ones_by_square_root(
    optimizer, rule
):
    assert resolve_scaling(optimizer, "auto") == rule
    assert resolve_scaling(optimizer, "none") == "none"  # an explicit rule wins


@pytest.mark.unit
def test_scaled_rates_follow_the_rule_for_the_number_of_ranks():
    assert scaled_learning_rate(0.01, 4, "linear") == pytest.approx(0.04)
    assert scaled_learning_rate(0.01, -4, "linear") == pytest.approx(0.04)  # local mode
    assert scaled_learning_rate(0.01, 4, "sqrt") == pytest.approx(0.02)
    assert scaled_learning_rate(0.01, 4, "none") == pytest.approx(0.01)
    with pytest.raises(ValueError, match="lr_scaling 'auto' is not a rule"):
        scaled_learning_rate(0.01, 4, "auto")
    with pytest.raises(ValueError, match="lr_scaling 'cubic' is unknown"):
        resolve_scaling("adam", "cubic")


@pytest.mark.unit
def test_the_warm_up_climbs_in_a_straight_line_from_the_base_to_the_scaled_rate():
    plan = learning_rate_plan("adadelta", 1.0, 4, "auto", warmup_epochs=2, steps_per_epoch=5)
    assert plan == LearningRatePlan(base=1.0, ranks=4, rule="linear", warmup_steps=10)
    assert [plan.at_step(s) for s in (0, 5, 10, 50)] == [1.0, 2.5, 4.0, 4.0]


@pytest.mark.unit
def test_nothing_to_warm_up_to_means_no_warm_up():
    one_rank = learning_rate_plan("adam", 0.01, 1, "auto", warmup_epochs=3, steps_per_epoch=9)
    unscaled = learning_rate_plan("adam", 0.01, 4, "none", warmup_epochs=3, steps_per_epoch=9)
    no_epochs = learning_rate_plan("adam", 0.01, 4, "auto", warmup_epochs=0, steps_per_epoch=9)
    assert one_rank.warmup_steps == unscaled.warmup_steps == no_epochs.warmup_steps == 0
    assert no_epochs.at_step(0) == pytest.approx(0.02)
    # A fraction of an epoch is at least one step.
    assert learning_rate_plan("sgd", 0.1, 2, warmup_epochs=0.01, steps_per_epoch=3).warmup_steps
    assert math.isclose(one_rank.target, 0.01)


@pytest.mark.unit
def test_the_keras_schedule_gives_the_plans_rates_and_survives_horovods_rebuild():
    import tensorflow as tf

    from hvdflow.training.optimizers import make_planned_optimizer

    plan = learning_rate_plan("adam", 0.01, 4, "sqrt", warmup_epochs=1, steps_per_epoch=8)
    optimizer = make_planned_optimizer("adam", plan)
    schedule = optimizer._learning_rate
    for step in (0, 3, 8, 20):
        assert float(schedule(step)) == pytest.approx(plan.at_step(step))
    # hvd.DistributedOptimizer rebuilds the optimizer from its config: the schedule must come back.
    rebuilt = type(optimizer).from_config(optimizer.get_config())
    assert float(rebuilt._learning_rate(4)) == pytest.approx(plan.at_step(4))
    assert isinstance(rebuilt._learning_rate, tf.keras.optimizers.schedules.LearningRateSchedule)


@pytest.mark.unit
def test_a_plan_says_how_its_rate_was_made():
    linear = learning_rate_plan("adam", 0.01, 2, "linear", warmup_epochs=1, steps_per_epoch=45)
    assert linear.describe() == (
        "0.02 (0.01 x 2 ranks, lr_scaling 'linear'; warm-up from 0.01 over 45 steps)"
    )
    sqrt = learning_rate_plan("adam", 0.01, 4, "auto")
    assert sqrt.describe() == "0.02 (0.01 x sqrt(4) ranks, lr_scaling 'sqrt'; no warm-up)"
    assert learning_rate_plan("sgd", 0.1, 1).describe() == "0.1 (lr_scaling 'linear', 1 rank(s))"


@pytest.mark.unit
def test_a_global_batch_is_split_among_the_ranks_and_keeps_the_one_rank_rate():
    assert [rank_batch_size(128, n, global_batch=True) for n in (1, 2, 4, 3)] == [128, 64, 32, 42]
    assert rank_batch_size(2, 4, global_batch=True) == 1  # never an empty batch
    assert rank_batch_size(128, 4, global_batch=False) == 128
    plan = learning_rate_plan(
        "adadelta", 1.0, 2, "linear", warmup_epochs=1, steps_per_epoch=50, global_batch=True
    )
    assert (plan.rule, plan.target, plan.warmup_steps) == ("none", 1.0, 0)
