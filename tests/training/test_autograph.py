import pytest

from hvdflow.training.autograph import run_horovod_unconverted


@pytest.mark.unit
def test_horovods_functions_are_left_as_written_and_the_rule_is_added_once(monkeypatch):
    import horovod.tensorflow as hvd
    from tensorflow.python.autograph.core import config
    from tensorflow.python.autograph.impl import conversion

    monkeypatch.setattr(config, "CONVERSION_RULES", config.CONVERSION_RULES)  # restored after
    assert not conversion.is_allowlisted(hvd.allreduce)  # AutoGraph would rewrite it

    run_horovod_unconverted()
    run_horovod_unconverted()

    assert conversion.is_allowlisted(hvd.allreduce)
    assert conversion.is_allowlisted(hvd.DistributedGradientTape)
    skipped = [r for r in config.CONVERSION_RULES if isinstance(r, config.DoNotConvert)]
    assert sum(rule.matches("horovod") for rule in skipped) == 1
    assert conversion.is_allowlisted(pytest.approx) is False  # everyone else's code as before
