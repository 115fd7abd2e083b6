import pytest


@pytest.mark.unit
@pytest.mark.parametrize("name", ["adadelta", "rmsprop", "adam", "radam", "sgd"])
def test_the_papers_optimizers_build(name):
    from training.optimizers import make_optimizer

    optimizer = make_optimizer(name, 0.01)
    assert float(optimizer.learning_rate) == pytest.approx(0.01)
    if name == "radam":
        assert type(optimizer).__name__ == "RectifiedAdam"


@pytest.mark.unit
def test_an_unknown_optimizer_names_the_choices():
    from training.optimizers import make_optimizer

    with pytest.raises(ValueError, match="optimizer 'nope' is unknown: expected one of"):
        make_optimizer("nope", 0.01)
