import pytest

# What AutoGraph is told about Horovod's and Petastorm's functions: the classic profile's.
pytest.importorskip("horovod", reason="horovod is not installed (current profile)")
pytest.importorskip("petastorm", reason="petastorm is not installed (current profile)")

from hvdflow.training.autograph import (  # noqa: E402
    HOROVOD,
    PETASTORM,
    run_horovod_unconverted,
    run_petastorm_unconverted,
)


@pytest.fixture
def autograph_state(monkeypatch):
    """AutoGraph's rules and Horovod's subgraph factory as TensorFlow and Horovod ship them
    (an earlier test on this worker may have trained or read a dataset), restored after."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.functions as hvd_functions
    import horovod.tensorflow.util as hvd_util
    from tensorflow.python.autograph.core import config

    shipped = tuple(
        rule
        for rule in config.CONVERSION_RULES
        if not (
            isinstance(rule, config.DoNotConvert)
            and (rule.matches(HOROVOD) or rule.matches(PETASTORM))
        )
    )
    monkeypatch.setattr(config, "CONVERSION_RULES", shipped)
    monkeypatch.setattr(hvd_tf, "_make_subgraph", hvd_util._make_subgraph)
    monkeypatch.setattr(hvd_functions, "_make_subgraph", hvd_util._make_subgraph)
    return config


def _rules_matching(config, package: str) -> int:
    skipped = [r for r in config.CONVERSION_RULES if isinstance(r, config.DoNotConvert)]
    return sum(rule.matches(package) for rule in skipped)


@pytest.mark.unit
def test_horovods_functions_are_left_as_written_and_the_rule_is_added_once(autograph_state):
    import horovod.tensorflow as hvd
    from tensorflow.python.autograph.impl import conversion

    assert not conversion.is_allowlisted(hvd.allreduce)  # AutoGraph would rewrite it

    run_horovod_unconverted()
    run_horovod_unconverted()

    assert conversion.is_allowlisted(hvd.allreduce)
    assert conversion.is_allowlisted(hvd.DistributedGradientTape)
    assert _rules_matching(autograph_state, "horovod") == 1
    assert conversion.is_allowlisted(pytest.approx) is False  # everyone else's code as before


@pytest.mark.unit
def test_horovods_own_tf_functions_are_traced_without_autograph(autograph_state):
    """Horovod wraps its allreduce and broadcast in tf.function itself: AutoGraph converts what a
    tf.function wraps whatever the rules say, so these are made with autograph=False. A Python
    `if` on a tensor tells the two apart: AutoGraph turns it into tf.cond, plain tracing
    refuses it."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.functions as hvd_functions
    import tensorflow as tf

    def sign(x):
        if x > 0:
            return x
        return -x

    assert float(hvd_tf._make_subgraph(sign)(tf.constant(-2.0))) == 2.0  # converted: tf.cond

    run_horovod_unconverted()

    for module in (hvd_tf, hvd_functions):
        with pytest.raises(TypeError, match="tf.Tensor"):
            module._make_subgraph(sign)(tf.constant(-2.0))


@pytest.mark.unit
def test_petastorms_functions_are_left_as_written_and_the_rule_is_added_once(autograph_state):
    from petastorm import tf_utils
    from tensorflow.python.autograph.impl import conversion

    assert not conversion.is_allowlisted(tf_utils._set_shape_to_named_tuple)

    run_petastorm_unconverted()
    run_petastorm_unconverted()

    assert conversion.is_allowlisted(tf_utils._set_shape_to_named_tuple)
    assert _rules_matching(autograph_state, "petastorm") == 1
