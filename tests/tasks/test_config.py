"""The flows' parameters: one nested shape, every bad value refused at the entry, by name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hvdflow.flows.prefect.benchmark import BenchParams
from hvdflow.flows.prefect.pipeline import PipelineParams
from hvdflow.infra import extras
from hvdflow.tasks.config import DataParams, LauncherParams, TrackingParams, TrainingParams

pytestmark = pytest.mark.unit


def error_of(cls, /, **values) -> str:
    with pytest.raises(ValidationError) as err:
        cls(**values)
    return str(err.value)


def test_the_pipeline_and_the_benchmark_share_one_shape():
    for name, model in (("data", DataParams), ("training", TrainingParams)):
        assert PipelineParams.model_fields[name].annotation is model
        assert BenchParams.model_fields[name].annotation is model
    assert PipelineParams.model_fields["launcher"].annotation is LauncherParams
    assert BenchParams.model_fields["launcher"].annotation is LauncherParams
    assert PipelineParams.model_fields["tracking"].annotation is TrackingParams


def test_one_default_registered_model_name():
    from hvdflow.tasks.train.run import TrainConfig

    assert PipelineParams().tracking.registered_model_name == "hvdflow-classifier"
    assert TrainConfig().tracking.registered_model_name == "hvdflow-classifier"


def test_np_zero_is_refused():
    assert "np=0: expected the number of ranks" in error_of(LauncherParams, np=0)
    assert LauncherParams(np=-2).np == -2


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("model", "resnet", "model 'resnet' is unknown: expected one of digits_mlp, inceptionv3"),
        ("optimizer", "nope", "optimizer 'nope' is unknown: expected one of adadelta, rmsprop"),
        ("epochs", 0, "greater than or equal to 1"),
        ("learning_rate", 0, "greater than 0"),
        ("profile_batches", [5, 5], "profile_batches [5, 5]: expected [start, stop] with 0 <= st"),
        ("profile_batches", [-1, 3], "profile_batches [-1, 3]: expected [start, stop]"),
        ("profile_batches", [1, 2, 3], "at most 2 items"),
    ],
)
def test_training_values_are_checked(field, value, expected):
    assert expected in error_of(TrainingParams, **{field: value})


def test_a_profile_is_off_by_default_and_taken_as_a_list_from_json():
    assert TrainingParams().profile_batches == (0, 0)
    assert TrainingParams(profile_batches=[10, 20]).profile_batches == (10, 20)


def test_names_are_case_insensitive_and_stored_lower_case():
    training = TrainingParams(model="MNIST_CNN", optimizer="Adadelta")
    assert (training.model, training.optimizer) == ("mnist_cnn", "adadelta")


def test_each_model_brings_its_optimizer_rate_and_warm_up_unless_told_otherwise():
    cnn = TrainingParams(model="mnist_cnn")
    assert (cnn.optimizer, cnn.learning_rate, cnn.warmup_epochs) == ("adam", 0.001, 1.0)
    # The CNN keeps its global batch across ranks (docs/learning-rate.md); the MLP, whose step
    # is all exchange, grows it.
    assert cnn.global_batch is True and TrainingParams().global_batch is False
    assert TrainingParams(model="mnist_cnn", global_batch=False).global_batch is False
    mlp = TrainingParams()
    assert (mlp.model, mlp.optimizer, mlp.learning_rate, mlp.lr_scaling) == (
        "digits_mlp",
        "adam",
        0.01,
        "auto",
    )
    # An optimizer without a rate gets that optimizer's customary rate, not the model's.
    assert TrainingParams(model="mnist_cnn", optimizer="adadelta").learning_rate == 1.0
    # A rate without an optimizer is a rate for the model's optimizer.
    given = TrainingParams(model="mnist_cnn", learning_rate=0.5, warmup_epochs=0)
    assert (given.optimizer, given.learning_rate, given.warmup_epochs) == ("adam", 0.5, 0)
    assert TrainingParams(model="gcn").learning_rate == 0.01
    assert "lr_scaling" in error_of(TrainingParams, lr_scaling="cubic")
    assert "greater than or equal to 0" in error_of(TrainingParams, warmup_epochs=-1)


def test_image_size_must_be_sane():
    assert "image_size (8, 40000) is out of bounds" in error_of(DataParams, image_size=(8, 40000))
    assert "image_size (1, 8) is out of bounds" in error_of(DataParams, image_size=(1, 8))
    assert DataParams(image_size=(299, 299)).image_size == (299, 299)


def test_input_folders_must_exist(tmp_path):
    missing = tmp_path / "nope"
    message = error_of(DataParams, input=str(missing), input_format="folders")
    assert f"input '{missing}' is not an existing folder" in message
    assert "input is empty: input_format='mnist_idx'" in error_of(
        DataParams, input_format="mnist_idx"
    )
    assert DataParams(input=str(tmp_path), input_format="folders").input == str(tmp_path)
    # The bundled digits are written where input points: it need not exist yet.
    assert DataParams(input=str(missing), input_format="digits").input == str(missing)


def test_a_bucket_input_is_accepted_and_other_urls_refused():
    assert DataParams(input="s3://bucket/images/", input_format="folders").input.startswith("s3")
    assert "bucket names have at least 3 characters" in error_of(
        DataParams, input="s3://b/x", input_format="folders"
    )
    assert "'digits' writes the bundled digits to a local folder" in error_of(
        DataParams, input="s3://bucket/x", input_format="digits"
    )
    assert "expected a folder every Spark executor can read" in error_of(
        DataParams, input="gs://bucket/x", input_format="folders"
    )


def test_every_rank_gets_row_groups_and_small_np_keeps_the_default():
    data = DataParams()
    assert (data.preprocess_config(ranks=2).np, data.preprocess_config(ranks=2).row_groups) == (
        2,
        8,
    )
    assert data.preprocess_config(ranks=-12).row_groups == 12
    assert data.preprocess_config(ranks=16).params() == {
        **data.preprocess_config(ranks=2).params(),
        "files_per_split": 16,
    }


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("s3://b/prefix", "bucket names have at least 3 characters"),
        ("s3://", "expected s3://bucket/prefix"),
        ("gs://bucket/x", "expected a local path or s3://bucket/prefix"),
    ],
)
def test_output_syntax(output, expected):
    assert expected in error_of(DataParams, output=output)


def test_weights_source_syntax_without_echoing_secrets(tmp_path):
    message = error_of(TrainingParams, weights_source="https://user:hunter2@/w.h5?sig=tok3n")
    assert "holds a password: pass it by reference" in message
    assert "the URL has no host" in error_of(TrainingParams, weights_source="https:///w.h5")
    assert "hunter2" not in message.split("input_value")[0]
    assert "tok3n" not in message.split("input_value")[0]
    assert "neither an http(s) URL, an existing file" in error_of(
        TrainingParams, weights_source=str(tmp_path / "missing.h5")
    )
    weights = tmp_path / "w.h5"
    weights.write_bytes(b"x")
    for source in (str(weights), weights.as_uri(), "https://host/w.h5", "", "keras:weights=None"):
        assert TrainingParams(weights_source=source).weights_source == source


def test_the_pipeline_refuses_graph_models():
    message = error_of(PipelineParams, training={"model": "gcn"})
    assert "run it with `hvdflow bench --model gcn`" in message
    assert BenchParams(training={"model": "gcn"}).training.model == "gcn"


def test_the_benchmark_takes_np_from_its_conditions():
    assert "leave launcher.np unset" in error_of(BenchParams, launcher={"np": 2})
    assert "condition 'two'" in error_of(BenchParams, conditions=["keras", "two"])
    assert "conditions is empty" in error_of(BenchParams, conditions=[])
    assert BenchParams(launcher={"horovod": {"cycle_time_ms": 10}}).launcher.np == 2


def test_unknown_parameters_are_refused():
    assert "Extra inputs are not permitted" in error_of(PipelineParams, training={"optimiser": 1})


def test_a_weights_url_can_be_a_reference_and_stays_one(monkeypatch):
    monkeypatch.setenv("HVDFLOW_TEST_WEIGHTS", "https://ann:hunter2@host/w.h5?sig=tok3n")
    for source in ("env:HVDFLOW_TEST_WEIGHTS", "secret:weights-url"):
        params = PipelineParams(training={"weights_source": source})
        assert params.training.weights_source == source
        assert "hunter2" not in params.model_dump_json()


def test_an_env_reference_is_checked_where_the_flow_runs_without_echoing_it(monkeypatch):
    monkeypatch.delenv("HVDFLOW_TEST_UNSET", raising=False)
    assert (
        "training.weights_source 'env:HVDFLOW_TEST_UNSET' refers to the environment variable "
        "HVDFLOW_TEST_UNSET, which is not set on the driver: export it where the flow runs"
    ).removeprefix("training.") in error_of(TrainingParams, weights_source="env:HVDFLOW_TEST_UNSET")
    monkeypatch.setenv("HVDFLOW_TEST_WEIGHTS", "ftp://ann:hunter2@host/w.h5?sig=tok3n")
    message = error_of(TrainingParams, weights_source="env:HVDFLOW_TEST_WEIGHTS")
    assert (
        "weights_source 'env:HVDFLOW_TEST_WEIGHTS' (= 'ftp://host/w.h5?<redacted>') is neither "
        "an http(s) URL, an existing file, nor 'keras:weights=None'"
    ) in message
    assert "hunter2" not in message and "tok3n" not in message
    assert "'secret:' (lower-case letters" in error_of(
        TrainingParams, weights_source="secret:Weights_URL"
    )


def test_a_rejected_literal_is_never_repeated_as_given():
    for model, values in (
        (TrainingParams, {"weights_source": "https://user:hunter2@/w.h5?sig=tok3n"}),
        (PipelineParams, {"training": {"weights_source": "https://user:hunter2@/w.h5?sig=tok3n"}}),
        (BenchParams, {"training": {"weights_source": "https://user:hunter2@/w.h5?sig=tok3n"}}),
        (LauncherParams, {"horovod": {"extra_env": {"TOKEN": "env:"}, "autotune": "hunter2"}}),
    ):
        message = error_of(model, **values)
        assert "hunter2" not in message and "tok3n" not in message, message


def test_framework_torch_where_torch_is_absent_says_what_to_install():
    if extras.installed(extras.TORCH):
        pytest.skip("torch is installed here (the current profile, which has none, checks this)")
    with pytest.raises(extras.MissingExtra, match=r"pip install 'hvdflow\[torch\]'"):
        TrainingParams(framework="torch")


def test_framework_torch_refuses_what_only_tensorflow_does():
    if not extras.installed(extras.TORCH):
        pytest.skip("torch is not installed here (the classic profile checks this)")
    assert TrainingParams(framework="torch", model="mnist_cnn").global_batch  # the recipe's
    with pytest.raises(ValidationError, match="PyTorch trains digits_mlp, mnist_cnn or vgg16"):
        TrainingParams(framework="torch", model="inceptionv3")
    for name, value in (("mixed_precision", True), ("eval_every", 0.1)):
        with pytest.raises(ValidationError, match=f"training.{name} is not for PyTorch"):
            TrainingParams(framework="torch", **{name: value})


def test_the_launcher_settings_are_launch_options_with_the_pipelines_own_two_defaults():
    from hvdflow.infra.launcher.options import LaunchOptions
    from hvdflow.tasks.config import default_engine

    launcher, runner = LauncherParams(), LaunchOptions()
    for name in ("start_timeout_s", "heartbeat_timeout_s", "relay", "horovod"):
        assert getattr(launcher, name) == getattr(runner, name), name
    # The pipeline's trainers report every batch: its stall watch is on. Its engine is the
    # one installed.
    assert (launcher.stall_timeout_s, runner.stall_timeout_s) == (600.0, None)
    assert launcher.engine == default_engine()
    assert launcher.launch_options() == LaunchOptions(engine=default_engine(), stall_timeout_s=600)
    given = LauncherParams(
        engine="tf_collective", heartbeat_timeout_s=30, stall_timeout_s=None, relay="always"
    )
    assert given.launch_options(engine="torch", log_dir="/tmp/x") == LaunchOptions(
        engine="torch",
        heartbeat_timeout_s=30,
        stall_timeout_s=None,
        relay="always",
        log_dir="/tmp/x",
    )


@pytest.mark.parametrize(
    "values",
    [
        {"stall_timeout_s": 3.0},
        {"heartbeat_timeout_s": 1.0},
        {"start_timeout_s": 0.0},
        {"relay": "sometimes"},
    ],
)
def test_a_launcher_setting_is_checked_as_launch_options_checks_it(values):
    from hvdflow.infra.launcher.options import LaunchOptions

    with pytest.raises(ValueError) as direct:
        LaunchOptions(**values)
    message = error_of(LauncherParams, **values)
    ((name, _),) = values.items()
    assert message.splitlines()[1] == name  # named by its field
    assert str(direct.value) in message


def test_the_pipeline_picks_an_engine_of_the_keras_trainer():
    for engine in ("torch", "mpi"):
        assert (
            f"launcher.engine={engine!r}: expected one of horovod, tf_collective (a PyTorch "
            "training runs on torch's: training.framework='torch')"
        ) in error_of(LauncherParams, engine=engine)


def test_the_schema_a_form_shows_offers_the_engines_and_relay_modes_and_says_what_they_do():
    # Prefect's UI draws a deployment's form from this schema and refuses what it does not allow.
    fields = LauncherParams.model_json_schema()["properties"]
    assert fields["engine"]["enum"] == ["horovod", "tf_collective"]
    assert fields["relay"]["enum"] == ["auto", "always", "never"]
    for name in ("engine", "relay", "heartbeat_timeout_s", "stall_timeout_s"):
        assert fields[name]["description"], name
    # Its bounds are the checks': a form refuses a zero start timeout or a two-second watch.
    assert fields["start_timeout_s"]["exclusiveMinimum"] == 0
    assert fields["heartbeat_timeout_s"]["minimum"] == fields["stall_timeout_s"]["minimum"] == 6


def test_a_deployments_schema_refuses_what_the_launcher_settings_refuse():
    import jsonschema

    schema = LauncherParams.model_json_schema()
    valid = jsonschema.Draft202012Validator(schema)
    assert valid.is_valid({"stall_timeout_s": None, "heartbeat_timeout_s": 6, "relay": "never"})
    for bad in (
        {"start_timeout_s": 0},
        {"heartbeat_timeout_s": 2},
        {"stall_timeout_s": 5.5},
        {"relay": "sometimes"},
        {"engine": "torch"},
    ):
        assert not valid.is_valid(bad), bad
        with pytest.raises(ValidationError):
            LauncherParams(**bad)
