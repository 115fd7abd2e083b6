"""The one shape of an embedded server: start, wait until it answers, stop its process group."""

from __future__ import annotations

import abc
import logging
import subprocess
from pathlib import Path
from typing import ClassVar, Self

from hvdflow.infra.services._process import (
    LOOPBACK,
    free_port,
    start_process,
    stop_process_group,
    url_host,
    wait_until_ready,
)

logger = logging.getLogger(__name__)


class Service(abc.ABC):
    """A server process on ``host`` (127.0.0.1 unless told otherwise) whose data, log and
    generated credentials live in ``home``.

    ``start()`` runs ``_command()`` with ``_env()`` in a process group of its own and polls
    ``_ready()``; ``stop()`` stops the whole group. Subclasses declare themselves in class
    attributes (name, log file, secret variables, timeouts); the logic stays here.
    """

    # Shown in log lines and errors ("SeaweedFS at http://127.0.0.1:8333").
    name: ClassVar[str] = "service"
    # The log file in ``home`` that the process writes to.
    log_name: ClassVar[str] = "server.log"
    # How long start() waits for the first answer.
    START_TIMEOUT_S: ClassVar[float] = 60.0
    # How long stop() waits after SIGTERM before it sends SIGKILL.
    STOP_TIMEOUT_S: ClassVar[float] = 10.0
    # Whether SIGKILL after STOP_TIMEOUT_S is this service's normal stop (logged at debug level).
    KILL_EXPECTED: ClassVar[bool] = False
    # How often start() asks _ready().
    POLL_INTERVAL_S: ClassVar[float] = 0.3
    # Whether it also listens on 127.0.0.1, whatever its bind address (its port must be free).
    ALSO_ON_LOOPBACK: ClassVar[bool] = False
    # Whether it refuses requests without credentials (a subclass may decide per instance).
    auth: bool = False

    def __init__(self, home: str | Path, port: int | None = None, *, host: str = LOOPBACK):
        self.home = Path(home)
        self.host = host
        self.port = port or free_port(host=host)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / self.log_name

    @property
    def pid(self) -> int | None:
        """The pid of the started process, which is also its process group's id."""
        return self.process.pid if self.process is not None else None

    def env(self) -> dict[str, str]:
        """The variables a client sets to use this server, credentials included."""
        return {}

    # Each variable of ``env()`` that holds a secret -> its key in ``credentials_path``.
    SECRET_VARIABLES: ClassVar[dict[str, str]] = {}

    @property
    def credentials_path(self) -> Path:
        """The 0600 file that keeps this server's generated secrets."""
        return self.home / "credentials.json"

    def secret_sources(self) -> dict[str, str]:
        """For each secret of ``env()``, where it is kept, to show instead of the value
        (``'"password" in /home/u/.hvdflow/mlflow/credentials.json'``)."""
        if not self.auth:
            return {}
        return {
            variable: f'"{key}" in {self.credentials_path}'
            for variable, key in self.SECRET_VARIABLES.items()
        }

    @abc.abstractmethod
    def _command(self) -> list[str]:
        """The command line that runs the server in the foreground."""

    @abc.abstractmethod
    def _env(self) -> dict[str, str]:
        """The whole environment of the server process."""

    @abc.abstractmethod
    def _ready(self) -> bool:
        """True once the server answers; may raise while it does not yet."""

    def _prepare(self) -> None:
        """Create what the command needs on disk before it runs."""
        self.home.mkdir(parents=True, exist_ok=True)

    def start(self, timeout_s: float | None = None, *, setting: str | None = None) -> Self:
        """Start the server and wait until it answers; stop it again if it never does.
        ``timeout_s`` (default START_TIMEOUT_S) comes with ``setting``, its name for errors."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(
                f"{self.name} at {self.url} is already running (pid {self.process.pid}): "
                "stop() it before starting it again"
            )
        timeout_s, setting = self._start_timeout(timeout_s, setting)
        self._prepare()
        self.process = start_process(self._command(), self.log_path, self._env())
        logger.info("starting %s at %s (log: %s)", self.name, self.url, self.log_path)
        try:
            wait_until_ready(
                self.process,
                self._ready,
                what=f"{self.name} at {self.url}",
                timeout_s=timeout_s,
                setting=setting,
                log_path=self.log_path,
                interval_s=self.POLL_INTERVAL_S,
            )
        except BaseException:
            self.stop()
            raise
        logger.info("%s is ready at %s", self.name, self.url)
        return self

    def _start_timeout(self, timeout_s: float | None, setting: str | None) -> tuple[float, str]:
        """The start timeout in force and the name of where it comes from."""
        if timeout_s is None:
            if setting is not None:
                raise ValueError(
                    f"setting={setting!r} names where timeout_s comes from, but timeout_s is "
                    "None: pass both, or neither to use START_TIMEOUT_S"
                )
            return self.START_TIMEOUT_S, setting_name(type(self), "START_TIMEOUT_S")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s!r} must be > 0 seconds")
        return timeout_s, setting or f"{type(self).__name__}.start(timeout_s={timeout_s!r})"

    def stop(self) -> None:
        """Stop the process group: SIGTERM, SIGKILL after STOP_TIMEOUT_S. Safe to call twice."""
        stop_process_group(self.process, self.STOP_TIMEOUT_S, kill_expected=self.KILL_EXPECTED)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def setting_name(cls: type, attribute: str) -> str:
    """``module.Class.ATTRIBUTE`` of the class in ``cls``'s MRO that defines ``attribute``."""
    for klass in cls.__mro__:
        if attribute in vars(klass):
            return f"{klass.__module__}.{klass.__qualname__}.{attribute}"
    raise AttributeError(f"{cls.__qualname__} has no attribute {attribute!r}")
