"""Environment variable names and Spark conf keys, in one place.

Horovod reads its settings from the environment at ``hvd.init()``; the names below are the ones
its C++ core and Python layer look up. hvdflow's own variables carry the ``HVDFLOW_`` prefix.
"""

# --- Engines: Horovod over Gloo (rendezvous on rank 0's task); TensorFlow's collectives, whose
# workers meet at the endpoints in TF_CONFIG; torch.distributed, meeting at rank 0's MASTER_ADDR.
HOROVOD = "horovod"
TF_COLLECTIVE = "tf_collective"
TORCH = "torch"
# Every engine the launcher runs (LaunchOptions.engine).
ENGINES = (HOROVOD, TF_COLLECTIVE, TORCH)
# Those a pipeline's launcher.engine names (Keras); PyTorch training always runs on torch's.
PIPELINE_ENGINES = (HOROVOD, TF_COLLECTIVE)

# --- torch.distributed: what torchrun sets; init_process_group() reads the first four ---
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
ROLE_RANK = "ROLE_RANK"
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
ROLE_NAME = "ROLE_NAME"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
OMP_NUM_THREADS = "OMP_NUM_THREADS"

# --- Horovod: the rank's place in the job (read by horovod/common/gloo/gloo_context.cc) ---
HOROVOD_RANK = "HOROVOD_RANK"
HOROVOD_SIZE = "HOROVOD_SIZE"
HOROVOD_LOCAL_RANK = "HOROVOD_LOCAL_RANK"
HOROVOD_LOCAL_SIZE = "HOROVOD_LOCAL_SIZE"
HOROVOD_CROSS_RANK = "HOROVOD_CROSS_RANK"
HOROVOD_CROSS_SIZE = "HOROVOD_CROSS_SIZE"
HOROVOD_HOSTNAME = "HOROVOD_HOSTNAME"

# --- Horovod: Gloo rendezvous over HTTP, no MPI and no ssh ---
HOROVOD_GLOO_RENDEZVOUS_ADDR = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
HOROVOD_GLOO_RENDEZVOUS_PORT = "HOROVOD_GLOO_RENDEZVOUS_PORT"
HOROVOD_CONTROLLER = "HOROVOD_CONTROLLER"
HOROVOD_CPU_OPERATIONS = "HOROVOD_CPU_OPERATIONS"
# The network interface Gloo opens its pairs on; must carry the address the peers reach.
HOROVOD_GLOO_IFACE = "HOROVOD_GLOO_IFACE"

# --- Horovod: performance knobs, exposed through HorovodOptions ---
HOROVOD_TIMELINE = "HOROVOD_TIMELINE"
HOROVOD_TIMELINE_MARK_CYCLES = "HOROVOD_TIMELINE_MARK_CYCLES"
HOROVOD_AUTOTUNE = "HOROVOD_AUTOTUNE"
HOROVOD_AUTOTUNE_LOG = "HOROVOD_AUTOTUNE_LOG"
HOROVOD_FUSION_THRESHOLD = "HOROVOD_FUSION_THRESHOLD"
HOROVOD_CYCLE_TIME = "HOROVOD_CYCLE_TIME"
HOROVOD_GLOO_TIMEOUT_SECONDS = "HOROVOD_GLOO_TIMEOUT_SECONDS"

# --- tf_collective: {"cluster": {"worker": [host:port, ...]}, "task": {"type": "worker",
# "index": rank}}, read by MultiWorkerMirroredStrategy's TFConfigClusterResolver ---
TF_CONFIG = "TF_CONFIG"

# --- GPUs: each rank sees only the GPU of its local rank ---
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

# --- Python: a rank's module path, its task's less Spark's zips (_engines.rank_python_path) ---
PYTHONPATH = "PYTHONPATH"

# --- hvdflow: set by the launcher in every rank process ---
# File descriptor of the pipe on which a rank reports events (init reached, progress).
HVDFLOW_EVENT_FD = "HVDFLOW_EVENT_FD"
# Marks rank processes, so that tests and clean-up can find any that outlive their run.
HVDFLOW_RUN_ID = "HVDFLOW_RUN_ID"

# --- hvdflow: user configuration ---
# Spark master for the default session (local[N] when unset), like spark-submit's --master.
HVDFLOW_SPARK_MASTER = "HVDFLOW_SPARK_MASTER"
# Spark Connect's own variable: the sc:// URL of the server a client reaches.
SPARK_REMOTE = "SPARK_REMOTE"

# --- Spark conf keys ---
# Python used by executors: without it workers start the system Python and cannot import
# petastorm, horovod or hvdflow itself.
SPARK_PYSPARK_PYTHON = "spark.pyspark.python"
SPARK_PYSPARK_DRIVER_PYTHON = "spark.pyspark.driver.python"
# The address executors use to reach the driver; the tasks' channel binds to it.
SPARK_DRIVER_HOST = "spark.driver.host"
SPARK_DRIVER_BIND_ADDRESS = "spark.driver.bindAddress"
SPARK_UI_ENABLED = "spark.ui.enabled"
# The executors' JVM options; hvdflow adds their temporary folder on standalone masters.
SPARK_EXECUTOR_EXTRA_JAVA_OPTIONS = "spark.executor.extraJavaOptions"
SPARK_DRIVER_EXTRA_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
SPARK_LOCAL_DIR = "spark.local.dir"
# Cores one task takes: slot counting divides executor cores by it.
SPARK_TASK_CPUS = "spark.task.cpus"
# Spark re-checks a barrier stage lacking slots for minutes; hvdflow counts first, keeps this short.
SPARK_BARRIER_CHECK_INTERVAL = "spark.scheduler.barrier.maxConcurrentTasksCheck.interval"
SPARK_BARRIER_CHECK_MAX_FAILURES = "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures"

# --- Spark: who can reach the driver's web UI, and what it lets them do ---
# Spark 4.0's web UI listens on the driver JVM's $SPARK_LOCAL_IP, else on every interface (no conf
# key): infra/spark.py sets it to the driver's bind address.
SPARK_LOCAL_IP = "SPARK_LOCAL_IP"
# The UI's kill links: off, or anyone who reaches the UI could stop a training run.
SPARK_UI_KILL_ENABLED = "spark.ui.killEnabled"
# Spark's console progress bar garbles log lines with carriage returns: off (SparkProgress logs
# stage progress instead); get_spark(conf={...: "true"}) turns it back on.
SPARK_UI_SHOW_CONSOLE_PROGRESS = "spark.ui.showConsoleProgress"

# --- Object storage: the standard AWS variables, read by boto3 and by hvdflow ---
AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"
AWS_ENDPOINT_URL_S3 = "AWS_ENDPOINT_URL_S3"
AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
AWS_DEFAULT_REGION = "AWS_DEFAULT_REGION"
AWS_REGION = "AWS_REGION"
# hvdflow's bucket and key prefix within it.
HVDFLOW_BUCKET = "HVDFLOW_BUCKET"
HVDFLOW_PREFIX = "HVDFLOW_PREFIX"
# Where executors keep downloaded weights, verified by checksum (default ~/.cache/hvdflow).
HVDFLOW_CACHE_DIR = "HVDFLOW_CACHE_DIR"
# Where `hvdflow up` keeps the embedded services' data and state.
HVDFLOW_HOME = "HVDFLOW_HOME"

# --- Tracking and orchestration: the variables MLflow's and Prefect's clients read ---
MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
# The tracking server's job runner (MLflow 3), off in the embedded server.
MLFLOW_SERVER_ENABLE_JOB_EXECUTION = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
# The object store behind the tracking server's artifact proxy (read by the server).
MLFLOW_S3_ENDPOINT_URL = "MLFLOW_S3_ENDPOINT_URL"
# Basic-auth login for a tracking server that requires one (sent with every request).
MLFLOW_TRACKING_USERNAME = "MLFLOW_TRACKING_USERNAME"
MLFLOW_TRACKING_PASSWORD = "MLFLOW_TRACKING_PASSWORD"
PREFECT_API_URL = "PREFECT_API_URL"
# "user:password" that Prefect's client sends as HTTP basic auth to a server that requires it.
PREFECT_API_AUTH_STRING = "PREFECT_API_AUTH_STRING"

# --- Credentials of the embedded servers: read by the servers themselves, never by clients ---
# MLflow's basic-auth app (`mlflow server --app-name basic-auth`): its ini file (admin user,
# user database, default permission) and the static key that signs its CSRF tokens.
MLFLOW_AUTH_CONFIG_PATH = "MLFLOW_AUTH_CONFIG_PATH"
MLFLOW_FLASK_SERVER_SECRET_KEY = "MLFLOW_FLASK_SERVER_SECRET_KEY"
# MLflow reads these before its ini file's admin_username/admin_password: kept out of the
# embedded server's environment, so that the ini file alone decides.
MLFLOW_AUTH_ADMIN_USERNAME = "MLFLOW_AUTH_ADMIN_USERNAME"
MLFLOW_AUTH_ADMIN_PASSWORD = "MLFLOW_AUTH_ADMIN_PASSWORD"
# The "user:password" the Prefect server requires of every API call but its health check.
PREFECT_SERVER_API_AUTH_STRING = "PREFECT_SERVER_API_AUTH_STRING"

# Copied from the driver's environment into every rank at run(): executors started before the
# driver set them (a long-lived session, a cluster) would lack the store's and tracker's settings.
FORWARDED_TO_RANKS = (
    AWS_ENDPOINT_URL,
    AWS_ENDPOINT_URL_S3,
    AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY,
    "AWS_SESSION_TOKEN",
    AWS_DEFAULT_REGION,
    AWS_REGION,
    "AWS_PROFILE",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_S3_ENDPOINT_URL",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    HVDFLOW_BUCKET,
    HVDFLOW_PREFIX,
    HVDFLOW_CACHE_DIR,
    # Databricks' way to record a Horovod timeline: set it on the driver before run().
    HOROVOD_TIMELINE,
)

# --- hvdflow: set by the launcher's task in the rank process it starts ---
# Pid of the supervising task: the rank exits at once if its parent is no longer that process
# (the task died before the rank could ask for PR_SET_PDEATHSIG).
HVDFLOW_PARENT_PID = "HVDFLOW_PARENT_PID"
# File where the rank's faulthandler writes its Python stacks when the task asks (SIGUSR1): a
# stalled run fails with every rank's stacks in its error.
HVDFLOW_STACKS_FILE = "HVDFLOW_STACKS_FILE"
# Which engine the rank runs under ("horovod" or "tf_collective"): the rank reports reaching
# hvd.init() or the creation of a MultiWorkerMirroredStrategy as its start.
HVDFLOW_ENGINE = "HVDFLOW_ENGINE"
# The rank's socket to its Spark task, answering BarrierTaskContext's calls (allGather, barrier),
# and the task's context as JSON. Set only where a task runs one rank.
HVDFLOW_TASK_CONTEXT_FD = "HVDFLOW_TASK_CONTEXT_FD"
HVDFLOW_TASK_CONTEXT = "HVDFLOW_TASK_CONTEXT"
# "1": the rank binds itself to its share of the host's cores (infra/launcher/_engines.py); set by
# the launcher on ranks without a GPU unless the options or the executor's environment say "0".
HVDFLOW_BIND_TO_CORES = "HVDFLOW_BIND_TO_CORES"
