"""``horovod.extra_env`` values may be references, resolved on the driver when the ranks start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hvdflow import HorovodRunner, LaunchOptions
from hvdflow.infra.launcher.options import HorovodOptions

TOKEN = "rank-token-9c1f4e2b7a"


@pytest.mark.unit
def test_references_stay_references_until_the_ranks_environment_is_built(monkeypatch):
    monkeypatch.setenv("HVDFLOW_TEST_TOKEN", TOKEN)
    options = HorovodOptions(extra_env={"API_TOKEN": "env:HVDFLOW_TEST_TOKEN", "PLAIN": "1"})
    assert options.model_dump()["extra_env"] == {
        "API_TOKEN": "env:HVDFLOW_TEST_TOKEN",
        "PLAIN": "1",
    }
    assert TOKEN not in options.model_dump_json() and TOKEN not in repr(options)
    assert options.to_env() == {"API_TOKEN": TOKEN, "PLAIN": "1"}


@pytest.mark.unit
def test_a_malformed_reference_is_refused_when_the_options_are_built():
    with pytest.raises(ValidationError) as err:
        HorovodOptions(extra_env={"API_TOKEN": "env:not a name"})
    assert "extra_env['API_TOKEN'] 'env:not a name': an environment variable name follows" in str(
        err.value
    )


@pytest.mark.unit
def test_an_unset_variable_fails_at_launch_naming_the_setting(monkeypatch):
    monkeypatch.delenv("HVDFLOW_TEST_UNSET", raising=False)
    options = HorovodOptions(extra_env={"API_TOKEN": "env:HVDFLOW_TEST_UNSET"})
    with pytest.raises(RuntimeError, match=r"extra_env\['API_TOKEN'\] 'env:HVDFLOW_TEST_UNSET' "):
        options.to_env()


def read_token():
    import os

    return os.environ["API_TOKEN"], os.environ["BLOCK_TOKEN"]


@pytest.mark.integration
def test_ranks_get_the_values_of_env_and_secret_block_references(prefect_harness, monkeypatch):
    from prefect.blocks.system import Secret

    Secret(value=TOKEN + "-block").save("hvdflow-test-rank-token", overwrite=True)
    monkeypatch.setenv("HVDFLOW_TEST_TOKEN", TOKEN)
    options = HorovodOptions(
        extra_env={
            "API_TOKEN": "env:HVDFLOW_TEST_TOKEN",
            "BLOCK_TOKEN": "secret:hvdflow-test-rank-token",
        }
    )
    runner = HorovodRunner(np=-1, options=LaunchOptions(horovod=options))
    assert runner.run(read_token) == (TOKEN, TOKEN + "-block")
    assert TOKEN not in open(runner.log_path).read()


@pytest.mark.integration
def test_a_missing_secret_block_names_it_and_how_to_create_it(prefect_harness):
    options = HorovodOptions(extra_env={"T": "secret:hvdflow-test-no-such-block"})
    with pytest.raises(RuntimeError) as err:
        options.to_env()
    assert str(err.value) == (
        "extra_env['T'] 'secret:hvdflow-test-no-such-block': the Prefect Secret block "
        "'hvdflow-test-no-such-block' could not be loaded (ValueError): create it with "
        "`Secret(value=...).save('hvdflow-test-no-such-block')` on the Prefect server this "
        "flow uses"
    )
