"""What the command line does around every command: parameters, logging, one-line errors."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded by the commands that validate: `hvdflow --help` needs no pydantic
    from pydantic import BaseModel, ValidationError

from hvdflow.infra.home import hvdflow_home
from hvdflow.infra.secrets import redact_url

# Loggers that are chatty at INFO on the terminal; the log file still gets their warnings.
NOISY_LOGGERS = ("py4j", "pyspark", "httpx")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Prefect's run loggers, and a rank's log_to_driver line as HorovodRunner tags it: the runner's
# own logger already shows those on the terminal.
RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")
RANK_LOG_LINE = re.compile(r"\[\d+,\d+\]<log>:")


class InvalidParameters(ValueError):
    """A parameter the flow would reject: named, with its value and what is accepted."""


class FailedRun:
    """The one line a failed command prints: what went wrong and where the full log is."""

    def __init__(self, command: str, reason: str, log_path: Path | None):
        self.command, self.reason, self.log_path = command, reason, log_path

    def __str__(self) -> str:
        where = f" (full log: {self.log_path})" if self.log_path else ""
        return f"hvdflow {self.command} failed: {self.reason}{where}"


def one_line(error: BaseException, limit: int = 500) -> str:
    """The first line of an error's message, with its type when that adds something."""
    text = next((ln.strip() for ln in str(error).splitlines() if ln.strip()), "")
    kind = type(error).__name__
    line = text if kind in ("RuntimeError", "ValueError", "Exception") else f"{kind}: {text}"
    return line[:limit]


def nested_params(
    model: type[BaseModel], args: argparse.Namespace, flags: Mapping[str, str]
) -> BaseModel:
    """``model`` from ``--params`` JSON with the set flags on top (``flags``: attribute ->
    dotted parameter); InvalidParameters names the first bad parameter."""
    values: dict = {}
    if getattr(args, "params", None):
        try:
            values = json.loads(args.params)
        except ValueError as e:
            raise InvalidParameters(f"--params is not valid JSON ({e})") from None
        if not isinstance(values, dict):
            raise InvalidParameters(f"--params must be a JSON object, not {args.params!r}")
    for attribute, dotted in flags.items():
        value = getattr(args, attribute, None)
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    from pydantic import ValidationError  # noqa: PLC0415 (see the TYPE_CHECKING import above)

    try:
        return model.model_validate(values)
    except ValidationError as e:
        raise InvalidParameters(describe_validation_error(model, e, flags)) from None


def describe_validation_error(
    model: type[BaseModel], error: ValidationError, flags: Mapping[str, str] = {}
) -> str:
    """One line for the first error: the parameter (and its flag), the value, what is accepted."""
    errors = error.errors()
    first = errors[0]
    loc = [str(part) for part in first["loc"]]
    name = ".".join(loc) or "parameters"
    flag = next((f"--{a.replace('_', '-')}" for a, d in flags.items() if d == name), None)
    shown = f"{name} ({flag})" if flag else name
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        known = ", ".join(_fields_at(model, loc[:-1]))
        message = f"no such parameter; expected one of: {known}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if not loc:  # a check across several parameters: its message names them
        return f"invalid parameters: {message}{more}"
    value = first.get("input")
    if isinstance(value, str):
        value = redact_url(value)  # a URL may carry a password or a signed query
    shown_value = f"={value!r}" if not isinstance(value, dict) else ""
    return f"invalid parameter {shown}{shown_value}: {message}{more}"


def _fields_at(model: type[BaseModel], path: list[str]) -> list[str]:
    from pydantic import BaseModel  # noqa: PLC0415 (see the TYPE_CHECKING import above)

    for part in path:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


# What configure_logging was last asked for, so that adopt_prefect_logging can do it again.
_configured: dict = {}


class _StderrNow(logging.StreamHandler):
    """A console handler on the current ``sys.stderr``, not the one of when it was made: a
    swapped and closed stderr (a test's capture, a notebook cell) must not keep it."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass  # always the current sys.stderr


def configure_logging(
    level: str, command: str, *, show_tracebacks: bool, log_path: Path | None = None
) -> Path | None:
    """Log to the terminal at ``level`` and everything from INFO to a file in
    ``$HVDFLOW_HOME/logs`` (or ``log_path``); return its path. Without ``--debug`` only the file
    gets tracebacks (Prefect logs one for every failed task)."""
    _configured.update(level=level, command=command, show_tracebacks=show_tracebacks)
    root = logging.getLogger()
    _remove_our_handlers()  # main() may run twice in one process (tests, notebooks)
    terminal = getattr(logging, level.upper())
    root.setLevel(min(logging.INFO, terminal))
    # Propagating loggers reach the root's console; one on another logger (uvicorn's) is not it.
    if not set(root.handlers) & set(_console_handlers()):
        console = _StderrNow()
        console._hvdflow = True
        console.setFormatter(logging.Formatter(LOG_FORMAT))
        console.addFilter(_RankLinesOnce())
        root.addHandler(console)
    for handler in _console_handlers():
        handler.setLevel(terminal)
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)

    log_path = log_path or _log_file_path(command)
    _configured["log_path"] = log_path
    if log_path is not None:
        to_file = logging.FileHandler(log_path, encoding="utf-8")
        to_file._hvdflow = True
        to_file.setLevel(logging.INFO)
        to_file.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(to_file)
        for name in _non_propagating_loggers():
            logging.getLogger(name).addHandler(to_file)
    for handler in _console_handlers():
        inner = handler.formatter
        if isinstance(inner, _WithoutTraceback):
            inner = inner.inner
        handler.setFormatter(inner if show_tracebacks else _WithoutTraceback(inner))
    return log_path


def adopt_prefect_logging() -> None:
    """Import Prefect, then put back what configure_logging set up (Prefect's logging replaces
    the root's handlers). Call it once the environment points at the services: Prefect reads
    its settings when first imported."""
    import prefect.main  # noqa: F401

    if _configured:
        configure_logging(
            _configured["level"],
            _configured["command"],
            show_tracebacks=_configured["show_tracebacks"],
            log_path=_configured.get("log_path"),
        )


def _remove_our_handlers() -> None:
    for logger in [logging.getLogger(), *logging.root.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            for handler in [h for h in logger.handlers if getattr(h, "_hvdflow", False)]:
                logger.removeHandler(handler)
                handler.close()


def _log_file_path(command: str) -> Path | None:
    folder = hvdflow_home() / "logs"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # a read-only home: the terminal still gets the log
    return folder / f"hvdflow-{command}-{time.strftime('%Y%m%d-%H%M%S')}.log"


def _non_propagating_loggers() -> list[str]:
    return [
        name
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and not logger.propagate and logger.handlers
    ]


def _console_handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger()] + [
        logger
        for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    found = []
    for logger in loggers:
        for handler in logger.handlers:
            is_file = isinstance(handler, logging.FileHandler)
            stream = getattr(handler, "stream", None)
            if not is_file and stream in (sys.stderr, sys.stdout) and handler not in found:
                found.append(handler)
    return found


class _RankLinesOnce(logging.Filter):
    """The terminal shows each ``log_to_driver`` line of a rank once: not the copy the training
    step forwards to Prefect's run logger for its UI (the log file keeps both)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name in RUN_LOGGERS and RANK_LOG_LINE.match(str(record.getMessage())))


class _WithoutTraceback(logging.Formatter):
    """Wraps a handler's formatter and leaves the traceback out of what it shows."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__(LOG_FORMAT)
        self.inner = inner or logging.Formatter(LOG_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved
