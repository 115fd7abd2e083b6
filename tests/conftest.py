"""Session-wide real services: each fixture starts the thing once and stops what it started."""

from __future__ import annotations

import os

# Prefect binds its console log handler to the sys.stderr of the moment it is first imported:
# import it now, while that is the session's stream, not a test's capture that closes after it.
import prefect.main  # noqa: F401
import pytest

from tests.helpers import preprocessed_digits  # also marks this session's environment first
from tests.jvm_options import jvm_options

# Fixtures that live with their harness: the multi-host cluster and its services, a real
# Prefect server with a deployed run.
pytest_plugins = ["tests.cluster.fixtures", "tests.deployments"]

# The machine's hostname may resolve to an address that is not on any interface here.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

COST_TIERS = ("unit", "integration", "slow")
# Fixtures that start a JVM or a server: a test using one is not a unit test.
HEAVY_FIXTURES = {
    "spark",
    "seaweed",
    "store",
    "mlflow_server",
    "digits_dataset",
    "prefect_harness",
    "netns_cluster",
    "prefect_server",
    "connect_server",
    "deployed_pipeline_run",
    "browser",
}


# `make test` runs the suite on two pytest-xdist workers. Tests that share a machine-wide thing
# run on one worker, one after another: the multi-host harness (network namespaces, a standalone
# Spark cluster); the fake-GPU cluster (a module fixture that two workers would each start); the
# session's Prefect server with its deployed run (made once, looked at by several tests); and
# `hvdflow up`, which takes the conventional ports (5000, 8333, 4200) when they are free, a check
# two workers could pass at the same moment. The scheduler sees only node ids, so the groups are
# by path.
SERIAL_GROUPS = {
    "cluster": ("tests/cluster/", "tests/soak/"),
    "deployed": (
        "tests/ui/",
        "tests/flows/test_status.py",
        "tests/flows/test_deploy.py::test_a_worker",
        "tests/test_prefect_yaml.py",
        "tests/infra/services/test_prefect_server.py",
    ),
    # hvdflow's images, built once for these tests (tests/container/conftest.py); the current
    # image's `hvdflow run` is in "local-services", whose worker finds the build cached.
    "container": (
        "tests/container/test_image.py::test_each_",
        "tests/container/test_image.py::test_no_",
        "tests/container/test_spark_in_containers.py",
    ),
    # One standalone cluster with fake GPUs, started once for the module's tests.
    "fake-gpus": ("tests/infra/launcher/test_gpu_fidelity.py",),
    "local-services": (
        "tests/flows/test_cli.py::test_up_",
        "tests/flows/test_cli.py::test_two_runs_",
        "tests/flows/test_pipeline.py::test_a_served_deployment",
        "tests/infra/services/test_local.py",
        "tests/infra/services/test_service.py",
        # `hvdflow run` in a container on the host's network: its embedded services too.
        "tests/container/test_image.py::test_the_current_image_",
    ),
}
# Modules whose tests share a module-scoped fixture (a champion trained by the pipeline, a model
# registered, a server started): one unit each, so that the fixture is made once, not once on
# every worker that gets one of the module's tests (the score flow's champion was trained twice,
# 40 CPU-s). `_check_module_fixtures` keeps this list complete.
MODULE_UNITS = (
    "tests/flows/test_score.py",
    "tests/flows/test_torch_champion.py",
    "tests/tasks/score/test_job.py",
    "tests/tasks/weights/test_stage.py",
    "tests/training/test_scaling.py",
    "tests/infra/services/test_mlflow_server.py",
    "tests/test_package.py",
)
# `make test` runs every test once, under classic; under current it runs the tests marked
# `current`: the integration and slow tests that mark themselves, and these unit tests, whose code
# depends on the stack rather than on hvdflow's own logic (TensorFlow and Keras inside a rank,
# numpy and OpenCV in the image code, pyarrow and Spark's types in the schema, what an optional
# extra's absence changes). Elsewhere the unit tier is plain Python, the same on both stacks.
STACK_DEPENDENT = (
    "tests/training/",
    "tests/serving/",
    "tests/tasks/images/",
    "tests/tasks/preprocess/",
    "tests/flows/prefect/test_preprocess.py",
    "tests/tasks/test_config.py",
    "tests/infra/test_extras.py",
    "tests/infra/launcher/test_tf_engine.py",
    "tests/infra/launcher/test_placement.py",
    "tests/infra/launcher/test_rendezvous.py",
)
# The order tests are handed out in: the slow ones first, so that the last minutes are not one
# long test on one worker while the other waits (the groups go first anyway: xdist hands out the
# units with the most tests first).
TIER_ORDER = {"slow": 0, "integration": 1, "unit": 2}


def pytest_configure(config):
    """Every JVM the suite starts gets ``tests.jvm_options``: C1 alone and Spark's classes from
    an archive; how Java starts, not what Spark does. Set here, in xdist's controller before it
    starts its workers (they inherit it) or in a plain run; a JDK_JAVA_OPTIONS of the user's own
    wins. The unit tier starts no JVM, so it makes no archive."""
    if "JDK_JAVA_OPTIONS" not in os.environ:
        make = config.option.markexpr != "unit" and not config.option.collectonly
        os.environ["JDK_JAVA_OPTIONS"] = jvm_options(make_archive=make)


def serial_group(nodeid: str) -> str | None:
    for group, prefixes in SERIAL_GROUPS.items():
        if nodeid.startswith(prefixes):
            return group
    return None


def work_unit(nodeid: str) -> str:
    """What one worker runs together: a serial group, a module of MODULE_UNITS, else the test."""
    module = nodeid.split("::", 1)[0]
    return serial_group(nodeid) or (module if module in MODULE_UNITS else nodeid)


def pytest_xdist_make_scheduler(config, log):
    """Every test is a unit of its own, except the serial groups and MODULE_UNITS, each one unit
    on one worker. (xdist's own --dist loadgroup marks node ids in a way pytest 9.2 no longer
    keeps.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SerialGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SerialGroups(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(STACK_DEPENDENT) and _tier(item) == "unit":
            item.add_marker(pytest.mark.current)
    _check_cost_tiers(items)
    _check_module_fixtures(items)
    items.sort(key=lambda item: TIER_ORDER[_tier(item)])  # stable: file order within a tier


def _tier(item) -> str:
    return next(m.name for m in item.iter_markers() if m.name in COST_TIERS)


def _check_cost_tiers(items):
    """Every test names its cost tier (unit, integration or slow), exactly one, so that
    `make test-fast` (-m unit) runs only what is cheap; a unit test uses no heavy fixture."""
    problems = []
    for item in items:
        tiers = [m.name for m in item.iter_markers() if m.name in COST_TIERS]
        if len(set(tiers)) != 1:
            problems.append(f"{item.nodeid}: cost tiers {sorted(set(tiers)) or 'none'}")
        elif tiers[0] == "unit" and HEAVY_FIXTURES & set(item.fixturenames):
            heavy = sorted(HEAVY_FIXTURES & set(item.fixturenames))
            problems.append(f"{item.nodeid}: marked unit but uses {', '.join(heavy)}")
    if problems:
        raise pytest.UsageError(
            "each test needs exactly one of @pytest.mark.unit / integration / slow:\n  "
            + "\n  ".join(problems)
        )


def _check_module_fixtures(items):
    """A test that uses a module-scoped fixture runs in a unit that holds its whole module:
    otherwise each worker would make the fixture again."""
    loose = set()
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if serial_group(item.nodeid) or module in MODULE_UNITS:
            continue
        for name, defs in item._fixtureinfo.name2fixturedefs.items():
            if defs and defs[-1].scope == "module":
                loose.add(f"{module} (fixture {name})")
    if loose:
        raise pytest.UsageError(
            "modules with a module-scoped fixture must be in MODULE_UNITS or a serial group "
            "(tests/conftest.py):\n  " + "\n  ".join(sorted(loose))
        )


@pytest.fixture(autouse=True)
def _mlflow_tracking_uri_restored():
    """The tracking URI and experiment this test found, back after it. `mlflow.set_tracking_uri`
    (called by `train_and_track`) sets a module global that wins over $MLFLOW_TRACKING_URI, and
    sets that variable too: left as is, a later test on this worker that sets only the variable
    talks to this test's server, stopped by then (seen in CI as "Connection refused").
    `mlflow.set_experiment` (tasks/train/run.py, tasks/score/record.py) does the same with the
    active experiment and $MLFLOW_EXPERIMENT_ID: left as is, a later test's
    `start_run(run_id=...)` of a run in another experiment fails with "active experiment ID
    does not match environment run ID" (seen in CI)."""
    import sys

    before = {
        name: os.environ.get(name) for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")
    }
    yield
    # Not imported, nothing set: the unit tier need not import MLflow for this.
    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    if utils is not None and utils._tracking_uri is not None:
        utils.set_tracking_uri(None)  # public as mlflow.set_tracking_uri; also unsets the variable
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is not None:
        fluent._active_experiment_id = None  # what mlflow.set_experiment sets; no public unset
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local[2] Spark session for the whole run (its JVM takes 10-30 s to start)."""
    from hvdflow.infra.spark import get_spark

    session = get_spark(
        "local[2]",
        "hvdflow-tests",
        {
            "spark.ui.enabled": "false",
            "spark.local.dir": str(tmp_path_factory.mktemp("spark-local")),
            "spark.sql.shuffle.partitions": "2",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """A Spark Connect server on local[2] from pyspark's own jars, started once. Its clients
    run as separate processes (tests/connect_client.py): a Connect session in this process
    would turn every later pyspark call of this worker into a Connect one."""
    from hvdflow.infra.services.spark_connect import SparkConnectServer

    with SparkConnectServer(
        tmp_path_factory.mktemp("spark-connect"), conf={"spark.sql.shuffle.partitions": "2"}
    ) as server:
        yield server


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """The embedded SeaweedFS S3 server, started once; its AWS variables set for the session."""
    from hvdflow.infra._env import temporary_env
    from hvdflow.infra.services.seaweed import SeaweedServer

    server = SeaweedServer(tmp_path_factory.mktemp("seaweed")).start()
    try:
        with temporary_env(server.env()):
            yield server
    finally:
        server.stop()


@pytest.fixture
def store(seaweed, tmp_path, monkeypatch):
    """A bucket of the test's own (fresh prefix) on the session's SeaweedFS server."""
    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

    monkeypatch.setenv("HVDFLOW_CACHE_DIR", str(tmp_path / "cache"))
    object_store = ObjectStore(
        ObjectStoreConfig(
            bucket="hvdflow-tests", prefix=tmp_path.name, endpoint_url=seaweed.endpoint_url
        )
    )
    object_store.ensure_bucket()
    return object_store


@pytest.fixture(scope="session")
def mlflow_server(seaweed, tmp_path_factory):
    """A real `mlflow server` (sqlite, artifacts in the session's SeaweedFS) over HTTP."""
    from hvdflow.infra.services.mlflow_server import MlflowServer
    from hvdflow.infra.storage.object_store import ObjectStore, ObjectStoreConfig

    ObjectStore(
        ObjectStoreConfig(bucket="hvdflow-mlflow", endpoint_url=seaweed.endpoint_url)
    ).ensure_bucket()
    server = MlflowServer(
        tmp_path_factory.mktemp("mlflow"), "s3://hvdflow-mlflow/artifacts", seaweed.env()
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def digits_dataset(spark, tmp_path_factory):
    """The bundled digits, preprocessed once for the session (8x8 grayscale)."""
    return preprocessed_digits(spark, tmp_path_factory.mktemp("digits"), 8)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real ``prefect server start`` (API and UI, sqlite) for this worker's session: flows run
    in this process report to it (``prefect_harness``), and the deployed runs use it."""
    from hvdflow.infra.services.prefect_server import PrefectServer

    server = PrefectServer(tmp_path_factory.mktemp("prefect-server")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def prefect_harness(prefect_server):
    """Flows run in this process report to the session's Prefect server, as under Prefect's
    own ``prefect_test_harness`` (which would start a second server, on a new database)."""
    from prefect.context import SettingsContext, _temporary_global_settings_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url}):
        # Also for code in a contextvars context copied before this one (as the harness does).
        with _temporary_global_settings_context(SettingsContext.get()):
            yield
