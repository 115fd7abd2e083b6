"""The hvdflow command line as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from hvdflow.flows.cli import build_parser, main
from hvdflow.infra.services.local import LocalServices
from hvdflow.tasks.train.tags import ATTEMPTS_TAG
from tests.helpers import assert_refused_before_any_service


@pytest.mark.unit
@pytest.mark.parametrize(
    "command", ["smoke", "up", "down", "status", "run", "serve", "deploy", "bench"]
)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: hvdflow " + command in capsys.readouterr().out


@pytest.mark.unit
def test_the_cli_and_the_parameters_load_no_engine_and_help_loads_no_pydantic():
    """`hvdflow --help` and a bad parameter's one line must feel instant: the command line and
    the parameter layer import no Spark, Petastorm, TensorFlow, Horovod, MLflow or Prefect (a
    fresh interpreter, so nothing another test loaded counts), and help needs no pydantic."""
    heavy = ("pyspark", "petastorm", "tensorflow", "horovod", "mlflow", "prefect", "boto3")
    loaded = "sorted({m.split('.')[0] for m in sys.modules} & WATCHED)"
    probe = "\n".join(
        [
            "import sys",
            f"WATCHED = {{'pydantic', *{heavy!r}}}",
            "from hvdflow.flows.cli import main",
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass",
            f"print({loaded})",
            "import hvdflow.flows.params",
            "WATCHED.discard('pydantic')",
            f"print({loaded})",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    after_help, after_params = done.stdout.strip().splitlines()[-2:]
    assert after_help == "[]"
    assert after_params == "[]"


@pytest.mark.slow
def test_up_prints_working_urls_and_down_stops_everything(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    for name in ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    try:
        # (Two commands started together on a cold home: test_two_runs_started_together_...)
        assert main(["up", "--no-prefect"]) == 0
        out = capsys.readouterr().out
        services = LocalServices()
        urls = services.urls()
        assert set(urls) == {"s3", "mlflow"}
        assert urls["mlflow"] in out and urls["s3"] in out
        assert requests.get(urls["mlflow"] + "/health", timeout=5).status_code == 200
        secret = services.env()["AWS_SECRET_ACCESS_KEY"]
        assert secret not in out  # printed as where to find it, never the value
        pids = [info["pid"] for info in services.state().values()]
        assert main(["up", "--no-prefect"]) == 0  # idempotent: nothing new started
        assert [info["pid"] for info in LocalServices().state().values()] == pids
    finally:
        assert main(["down"]) == 0
    assert "stopped: mlflow, s3" in capsys.readouterr().out
    assert LocalServices().state() == {}
    assert main(["down"]) == 0
    assert "nothing was running" in capsys.readouterr().out


def run_cli(home: Path, *argv: str) -> subprocess.Popen:
    """``hvdflow <argv>`` as a user starts it: its own process, services from ``home``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")
    }
    return subprocess.Popen(
        [sys.executable, "-m", "hvdflow.flows.cli", *argv],
        env={**env, "HVDFLOW_HOME": str(home)},
        cwd=home.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# Rounds of the two-runs test, each on a new home: CI runs one (the suite's time budget);
# HVDFLOW_TEST_ROUNDS=5 repeats it, as a race deserves before a release.
ROUNDS = int(os.environ.get("HVDFLOW_TEST_ROUNDS", "1"))


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_two_runs_started_together_on_a_cold_home_both_finish_and_a_third_works(round_, tmp_path):
    """Two scheduled runs on a new worker: whichever starts the services first, the other waits
    for them and uses them; with np=2 each on local[2], the second training waits for the
    first's Spark slots. A third run afterwards finds everything as it should be, although the
    reader of its output goes away once its ranks have begun (as a Prefect worker SIGKILLed
    under its flow run does): it still finishes, in one training attempt, and registers."""
    np = "2"
    from mlflow import MlflowClient

    home = tmp_path / "home"
    params = json.dumps({"training": {"epochs": 1}})
    try:
        together = [run_cli(home, "run", "--np", np, "--params", params) for _ in range(2)]
        outputs = [process.communicate(timeout=600)[0] for process in together]
        assert [process.returncode for process in together] == [0, 0], [
            out[-3000:] for out in outputs
        ]
        assert all("hvdflow pipeline finished" in out for out in outputs)
        third = run_cli(home, "run", "--np", np, "--params", params)
        read = list(_until(third.stdout, "[1,0]"))
        third.stdout.close()  # the reader is gone; the run's next writes meet a broken pipe
        assert third.wait(timeout=600) == 0, "".join(read)[-3000:]

        services = LocalServices(home)
        client = MlflowClient(services.urls()["mlflow"])
        versions = client.search_model_versions("name = 'hvdflow-classifier'")
        assert sorted(int(v.version) for v in versions) == [1, 2, 3]  # one per run, none lost
        runs = sorted(
            (client.get_run(v.run_id).info for v in versions), key=lambda info: info.start_time
        )
        assert all(info.status == "FINISHED" for info in runs)
        third_run = client.get_run(max(versions, key=lambda v: int(v.version)).run_id)
        assert third_run.data.tags.get(ATTEMPTS_TAG, "1") == "1"  # not a retried training
        # Two slots of the spark-slots limit, np=2 each: the trainings took turns.
        assert runs[0].end_time <= runs[1].start_time
    finally:
        down = run_cli(home, "down")
        down.communicate(timeout=120)
    assert LocalServices(home).state() == {}


def _until(stream, text: str):
    """The lines of ``stream`` up to the first that holds ``text``."""
    for line in stream:
        yield line
        if text in line:
            return


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["run", "--np", "0"],
            "hvdflow run: invalid parameter launcher.np (--np)=0: np=0: expected the number of "
            "ranks, > 0 on the Spark cluster or < 0 for that many processes on the driver",
        ),
        (
            ["run", "--params", '{"training": {"optimizer": "nope"}}'],
            "hvdflow run: invalid parameter training.optimizer='nope': optimizer 'nope' is "
            "unknown: expected one of adadelta, rmsprop, adam, radam, sgd",
        ),
        (
            ["run", "--params", '{"training": {"optimiser": "sgd"}}'],
            "hvdflow run: invalid parameter training.optimiser='sgd': no such parameter; expected "
            "one of: model, framework, epochs, batch_size, global_batch, optimizer, learning_rate, "
            "lr_scaling, warmup_epochs, chance_margin, eval_every, eval_images, seed, "
            "checkpoints, checkpoint_keep, in_memory_max_mb, reader, mixed_precision, "
            "profile_batches, weights_source",
        ),
        (["run", "--params", "[1]"], "hvdflow run: --params must be a JSON object, not '[1]'"),
        (
            ["bench", "--model", "resnet"],
            "hvdflow bench: invalid parameter training.model (--model)='resnet': model 'resnet' "
            "is unknown: expected one of digits_mlp, inceptionv3, mnist_cnn, vgg16, gcn",
        ),
    ],
)
def test_a_bad_parameter_is_one_line_exit_2_and_starts_nothing(
    argv, expected, tmp_path, monkeypatch, capfd
):
    assert_refused_before_any_service(argv, expected, tmp_path, monkeypatch, capfd)


@pytest.mark.unit
def test_debug_shows_the_exception_instead(tmp_path, monkeypatch):
    from hvdflow.flows.cli_support import InvalidParameters

    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    with pytest.raises(InvalidParameters, match="launcher.np"):
        main(["--debug", "run", "--np", "0"])


@pytest.mark.unit
def test_a_secret_in_a_bad_parameter_is_not_echoed(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    source = "https://user:hunter2@/weights.h5?X-Amz-Signature=t0ken"
    assert main(["run", "--params", json.dumps({"training": {"weights_source": source}})]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1  # one line
    assert "holds a password: pass it by reference: 'env:NAME'" in err
    assert "hunter2" not in err and "t0ken" not in err


@pytest.mark.unit
@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"training": {"weights_source": "https://host/w.h5?X-Amz-Signature=t0ken"}},
            "training.weights_source='https://host/w.h5?<redacted>': weights_source "
            "'https://host/w.h5?<redacted>' holds a signed query: pass it by reference",
        ),
        (
            {"launcher": {"horovod": {"extra_env": {"HF_TOKEN": "t0ken"}}}},
            "horovod.extra_env['HF_TOKEN'] is a literal for a variable named like a secret: "
            "pass it by reference: 'env:NAME' (the variable NAME where the flow runs) or "
            "'secret:block-name' (a Prefect Secret block)",
        ),
    ],
)
def test_a_literal_secret_never_becomes_a_flow_parameter(
    params, expected, tmp_path, monkeypatch, capfd
):
    import jsonschema

    from hvdflow.flows.params import PipelineParams

    monkeypatch.setenv("HVDFLOW_HOME", str(tmp_path / "home"))
    assert main(["run", "--params", json.dumps(params)]) == 2
    (line,) = capfd.readouterr().err.strip().splitlines()
    assert expected in line and "t0ken" not in line
    assert not (tmp_path / "home" / "services.json").exists()  # no service was started
    # The same rule is in the schema that Prefect's server enforces on a deployment's
    # parameters, so a run asked for from the UI or the API is refused before it is stored.
    schema = PipelineParams.model_json_schema()
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(params))


@pytest.mark.integration
def test_a_failed_run_is_one_line_naming_the_full_log(
    prefect_harness, seaweed, mlflow_server, tmp_path
):
    from prefect.settings import PREFECT_API_URL

    # A real `hvdflow run` in its own process: the terminal a user would see.
    env = {
        **os.environ,
        "HVDFLOW_HOME": str(tmp_path / "home"),
        "MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
    }
    empty = tmp_path / "no-images"
    (empty / "cats").mkdir(parents=True)
    argv = ["run", "--input", str(empty), "--input-format", "folders", "--np", "-1"]
    done = subprocess.run(
        [sys.executable, "-m", "hvdflow.flows.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr  # tracebacks go to the log file, not the terminal
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hvdflow run failed: no images found in '{empty}' (folders)")
    log = Path(last.rsplit("(full log: ", 1)[1].rstrip(")"))
    assert log.parent == tmp_path / "home" / "logs"
    assert "Traceback" in log.read_text() and "no images found" in log.read_text()


@pytest.mark.unit
def test_log_lines_reach_the_terminal_once_prefect_has_set_up_its_own_logging(tmp_path, capfd):
    import logging

    from hvdflow.flows.cli_support import (
        _remove_our_handlers,
        adopt_prefect_logging,
        configure_logging,
    )

    root = logging.getLogger()
    level = root.level
    # Prefect's logging set-up puts a console of its own on uvicorn's logger, not on the root.
    server = logging.getLogger("tests.uvicorn")
    server.propagate = False
    prefects_console = logging.StreamHandler(sys.stderr)
    server.addHandler(prefects_console)
    try:
        configure_logging("INFO", "test", show_tracebacks=False, log_path=tmp_path / "t.log")
        adopt_prefect_logging()
        logging.getLogger("hvdflow.flows.prefect.train").info(
            "Spark stage 3 (save): 1/2 tasks done"
        )
        err = capfd.readouterr().err
    finally:
        server.removeHandler(prefects_console)
        _remove_our_handlers()
        root.setLevel(level)
    assert err.count("INFO hvdflow.flows.prefect.train: Spark stage 3 (save): 1/2 tasks done") == 1


@pytest.mark.unit
def test_the_terminal_shows_a_ranks_epoch_line_once_though_prefect_gets_a_copy():
    import logging

    from hvdflow.flows.cli_support import _RankLinesOnce

    def record(name, message):
        return logging.LogRecord(name, logging.INFO, __file__, 1, message, (), None)

    once = _RankLinesOnce()
    line = "[1,0]<log>:Epoch 1/2 done in 1.92s: loss=1.2087"
    assert once.filter(record("hvdflow.infra.launcher.runner.ranks", line))  # the runner's own
    assert not once.filter(record("prefect.task_runs", line))  # the copy for Prefect's UI
    assert once.filter(record("prefect.task_runs", "[1,0]<stdout>:44/44 - 2s - loss: 1.2"))
    assert once.filter(record("prefect.task_runs", "training digits_mlp with np=2"))
