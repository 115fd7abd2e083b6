"""The runners' options beyond the originals' arguments, as typed, frozen objects.

``LaunchOptions``: how hvdflow launches and watches the ranks. ``HorovodOptions``: Horovod's
knobs, as each rank's environment. ``launch_settings``: LaunchOptions' fields as a pydantic
model, for parameters that take them as data. The runners take them as ``options=``, so that
their own arguments read as the originals document them::

    HorovodRunner(np=2, options=LaunchOptions(stall_timeout_s=120, horovod=HorovodOptions(
        cycle_time_ms=10)))
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, field_validator

from hvdflow.infra import constants as c
from hvdflow.infra.launcher import _wire
from hvdflow.infra.secrets import SECRET_NAME_PATTERN, SECRET_URL_PATTERN, check_reference, resolve

logger = logging.getLogger(__name__)


class HorovodOptions(BaseModel):
    """Settings passed to every rank as the environment variables Horovod reads at ``hvd.init()``;
    unset fields leave Horovod's own defaults."""

    # extra_env may hold secrets: a validation error never repeats the input.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    timeline_path: str | None = Field(
        default=None,
        description="Write a Chrome-trace timeline here (rank 0). Slows training: Databricks "
        "measured about 40% on Inception3.",
    )
    timeline_mark_cycles: bool = False
    autotune: bool = False
    autotune_log: str | None = None
    fusion_threshold_bytes: Annotated[int, Field(ge=0)] | None = None
    cycle_time_ms: Annotated[float, Field(gt=0)] | None = None
    gloo_timeout_s: Annotated[int, Field(gt=0)] | None = None
    fp16_compression: bool = Field(
        default=False,
        description="send gradients as float16 in the allreduce (half the bytes on the wire); "
        "read by the training function, not an environment variable",
    )
    extra_env: dict[str, str] = Field(
        default_factory=dict,
        description="More variables for every rank. A value 'env:NAME' (the driver's variable "
        "NAME) or 'secret:block-name' (a Prefect Secret block) is resolved on the driver when "
        "the ranks start, so that parameters and logs hold only the reference. A flow refuses a "
        "literal URL with a password or a signed query, and any literal for a variable named "
        "like a key, token or password.",
        # What Prefect's server enforces on a deployment's parameters: the same rule.
        json_schema_extra={
            "patternProperties": {SECRET_NAME_PATTERN: {"pattern": "^(env|secret):"}},
            "additionalProperties": {"type": "string", "not": {"pattern": SECRET_URL_PATTERN}},
        },
    )

    @field_validator("extra_env")
    @classmethod
    def _references(cls, extra_env: dict[str, str]) -> dict[str, str]:
        for name, value in extra_env.items():
            check_reference(value, f"extra_env[{name!r}]")
        return extra_env

    def to_env(self) -> dict[str, str]:
        """The variables exactly as each rank gets them, ``extra_env``'s references resolved
        (``hvdflow.infra.secrets``): call it only to launch."""
        env: dict[str, str] = {}
        if self.timeline_path:
            env[c.HOROVOD_TIMELINE] = self.timeline_path
            if self.timeline_mark_cycles:
                env[c.HOROVOD_TIMELINE_MARK_CYCLES] = "1"
        if self.autotune:
            env[c.HOROVOD_AUTOTUNE] = "1"
            if self.autotune_log:
                env[c.HOROVOD_AUTOTUNE_LOG] = self.autotune_log
        if self.fusion_threshold_bytes is not None:
            env[c.HOROVOD_FUSION_THRESHOLD] = str(self.fusion_threshold_bytes)
        if self.cycle_time_ms is not None:
            env[c.HOROVOD_CYCLE_TIME] = f"{self.cycle_time_ms:g}"
        if self.gloo_timeout_s is not None:
            env[c.HOROVOD_GLOO_TIMEOUT_SECONDS] = str(self.gloo_timeout_s)
        for name, value in self.extra_env.items():
            env[name] = resolve(value, f"extra_env[{name!r}]")
        return env

    def warn_about_costs(self, forwarded: Mapping[str, str] | None = None) -> None:
        """Warn about what slows training; ``forwarded``: the driver's variables for the ranks."""
        timeline = self.timeline_path or (forwarded or {}).get(c.HOROVOD_TIMELINE)
        if timeline:
            logger.warning(
                "Horovod timeline enabled (%s): it slows training noticeably (Databricks measured "
                "about 40%% on Inception3); leave timeline_path and HOROVOD_TIMELINE unset for "
                "timing runs.",
                timeline,
            )


RELAY_MODES = ("auto", "always", "never")


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How hvdflow launches, watches and logs the ranks; every field has a default. Checked when
    created: a bad value raises ValueError naming the field.

    Args:
        engine: ``"horovod"`` (Gloo, its rendezvous on rank 0's task); ``"tf_collective"``:
            each rank gets TF_CONFIG for TensorFlow's MultiWorkerMirroredStrategy, rank r its
            worker r, rank 0 its chief (``MirroredStrategyRunner``'s); or ``"torch"``: each rank
            gets torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), so
            ``init_process_group()`` needs no arguments (``TorchDistributor``'s).
        horovod: Horovod's knobs (timeline, autotune, fusion threshold, ...) for every rank.
        spark: the session to run on; default: the active one, else ``hvdflow.get_spark()``.
        start_timeout_s: a rank that has not reached ``hvd.init()`` (or created its strategy,
            or returned from ``init_process_group()``) by then is stopped and the run fails.
        slot_wait_s: how long to wait for executors to offer the task slots before failing.
        heartbeat_timeout_s: a task the driver hears nothing from for this long (its host cut
            off or frozen) fails the run, named with its host; a task that hears nothing from
            the driver for this long kills its rank. At least 6 s (3 heartbeats).
        stall_timeout_s: a rank that finishes no batch for this long after ``hvd.init()``
            fails the run, named, with every rank's Python stacks in the error. Ranks report
            batches with ``report_progress`` (Keras: ``training.callbacks.ProgressCallback``);
            None (the default) turns the watch off, for a ``main`` that reports none.
        timeout_s: optional limit for the whole run.
        log_dir: where the run's log file goes; default: a new folder under
            ``$HVDFLOW_HOME/logs/runs/`` (``~/.hvdflow``), named by the time and the run id.
        on_log_line: called with every ``LogLine`` (time, rank, stream, text) as it arrives.
        forward_env: variables copied from the driver's environment into every rank at ``run``
            (default: the standard AWS and MLflow variables and hvdflow's own).
        relay: how the tasks reach the driver. ``"auto"`` (the default): directly, and through
            the object store (``AWS_ENDPOINT_URL``, ``HVDFLOW_BUCKET``) for a task that cannot
            connect within 5 s (a Spark Connect client no executor reaches); ``"always"``: the
            object store only; ``"never"``: directly only.
    """

    engine: str = c.HOROVOD
    horovod: HorovodOptions = field(default_factory=HorovodOptions)
    spark: Any = None
    start_timeout_s: float = 300.0
    slot_wait_s: float = 15.0
    heartbeat_timeout_s: float = _wire.DEFAULT_HEARTBEAT_TIMEOUT_S
    stall_timeout_s: float | None = None
    timeout_s: float | None = None
    log_dir: str | None = None
    on_log_line: Callable[[_wire.LogLine], None] | None = None
    forward_env: tuple[str, ...] = c.FORWARDED_TO_RANKS
    relay: str = "auto"

    def __post_init__(self) -> None:
        for name, check in FIELD_CHECKS.items():
            if (error := check(getattr(self, name))) is not None:
                raise ValueError(error)
        if isinstance(self.forward_env, str):
            raise ValueError(
                f"forward_env={self.forward_env!r}: expected a sequence of variable names"
            )
        # A list passed in is kept as a tuple: the options stay frozen all the way down.
        object.__setattr__(self, "forward_env", tuple(self.forward_env))

    def forwarded(self) -> dict[str, str]:
        """The driver's variables the ranks get (``forward_env``), read now."""
        import os  # noqa: PLC0415 (read at launch, not at import)

        return {k: os.environ[k] for k in self.forward_env if k in os.environ}


def checked_options(options: LaunchOptions | None) -> LaunchOptions:
    """A runner's ``options`` (the defaults for None), after refusing what is not one."""
    if options is not None and not isinstance(options, LaunchOptions):
        raise ValueError(
            f"options={options!r}: expected a LaunchOptions (from hvdflow import LaunchOptions)"
        )
    return options or LaunchOptions()


# Each ``*_error``: why ``value`` is no valid setting of that name; None if it is.


def heartbeat_timeout_error(value: Any) -> str | None:
    shortest = _wire.HEARTBEAT_INTERVAL_S * _wire.MIN_HEARTBEATS_PER_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= shortest:
        return (
            f"heartbeat_timeout_s={value!r}: expected at least {shortest:g} seconds "
            f"({_wire.MIN_HEARTBEATS_PER_TIMEOUT} heartbeats, one every "
            f"{_wire.HEARTBEAT_INTERVAL_S:g} s), so that one late heartbeat does not fail the run"
        )
    return None


def stall_timeout_error(value: Any) -> str | None:
    if value is None:
        return None
    shortest = _wire.HEARTBEAT_INTERVAL_S * _wire.MIN_HEARTBEATS_PER_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= shortest:
        return (
            f"stall_timeout_s={value!r}: expected None (no stall watch) or at least {shortest:g} "
            f"seconds ({_wire.MIN_HEARTBEATS_PER_TIMEOUT} heartbeats, which carry the progress)"
        )
    return None


def engine_error(value: Any) -> str | None:
    if value not in c.ENGINES:
        return f"engine={value!r}: expected one of {', '.join(c.ENGINES)}"
    return None


def relay_error(value: Any) -> str | None:
    if value not in RELAY_MODES:
        return f"relay={value!r}: expected one of {', '.join(RELAY_MODES)}"
    return None


def horovod_error(value: Any) -> str | None:
    if not isinstance(value, HorovodOptions):
        return f"horovod={value!r}: expected a HorovodOptions (from hvdflow import HorovodOptions)"
    return None


def _seconds_error(name: str, none_ok: bool) -> Callable[[Any], str | None]:
    def error(value: Any) -> str | None:
        if value is None and none_ok:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return f"{name}={value!r}: expected a positive number" + (
                " or None" if none_ok else " of seconds"
            )
        return None

    return error


# Each field's own check, in the order LaunchOptions makes them: the one place a launcher option
# is checked, for the runners and ``launch_settings``.
FIELD_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "engine": engine_error,
    "relay": relay_error,
    "horovod": horovod_error,
    "start_timeout_s": _seconds_error("start_timeout_s", none_ok=False),
    "slot_wait_s": _seconds_error("slot_wait_s", none_ok=False),
    "heartbeat_timeout_s": heartbeat_timeout_error,
    "stall_timeout_s": stall_timeout_error,
    "timeout_s": _seconds_error("timeout_s", none_ok=True),
}


# What a form or a schema shows of a setting (Prefect's UI, `hvdflow run --help`).
SETTING_HELP = {
    "engine": "what synchronises the ranks: Horovod (Gloo allreduce) or TensorFlow's "
    "MultiWorkerMirroredStrategy, on the same barrier launcher",
    "heartbeat_timeout_s": "a task not heard from for this long (host cut off or frozen) fails "
    "the run",
    "stall_timeout_s": "a rank that finishes no batch for this long fails the run, with every "
    "rank's Python stacks; None turns the watch off",
    "relay": "how the Spark tasks reach this process: directly, falling back to the object "
    "store for a task that cannot connect (auto), through the object store only (always), or "
    "directly only (never)",
}


# The bounds a schema states, so that a form refuses what the checks above would: seconds are
# positive, and the two watches last at least three heartbeats.
_SHORTEST_WATCH_S = _wire.HEARTBEAT_INTERVAL_S * _wire.MIN_HEARTBEATS_PER_TIMEOUT
SETTING_BOUNDS = {
    **{name: {"exclusiveMinimum": 0} for name in ("start_timeout_s", "slot_wait_s", "timeout_s")},
    "heartbeat_timeout_s": {"minimum": _SHORTEST_WATCH_S},
    "stall_timeout_s": {"minimum": _SHORTEST_WATCH_S},
}


class _LaunchSettings(BaseModel):
    def launch_options(self, **run: Any) -> LaunchOptions:
        """These settings as ``LaunchOptions``, what ``run`` gives (its session, ...) winning."""
        names = {f.name for f in dataclasses.fields(LaunchOptions)}
        given = {name: getattr(self, name) for name in type(self).model_fields if name in names}
        return LaunchOptions(**{**given, **run})


def launch_settings(
    *names: str, choices: dict[str, tuple] | None = None, **defaults: Any
) -> type[_LaunchSettings]:
    """A pydantic model of the ``LaunchOptions`` fields ``names``, for parameters that take them as
    data (YAML, JSON, a form), with LaunchOptions' types, defaults (but for ``defaults``: a value
    or a function giving it) and ``FIELD_CHECKS``; ``launch_options()`` makes the LaunchOptions.
    ``choices``: the values a schema offers for a field (the relay's modes by default)."""
    hints = typing.get_type_hints(LaunchOptions)
    found = {f.name: f for f in dataclasses.fields(LaunchOptions)}
    fields: dict[str, Any] = {}
    for name in names:
        option = found[name]
        kind = hints[name]
        if check := FIELD_CHECKS.get(name):
            kind = Annotated[kind, AfterValidator(_raising(check))]
        offered = {"relay": RELAY_MODES, **(choices or {})}.get(name)
        extra = {**({"enum": list(offered)} if offered else {}), **SETTING_BOUNDS.get(name, {})}
        shown = {"description": SETTING_HELP.get(name), "json_schema_extra": extra or None}
        if name in defaults:
            default = defaults[name]
            given = {"default_factory" if callable(default) else "default": default}
        elif option.default_factory is not dataclasses.MISSING:
            given = {"default_factory": option.default_factory}
        else:
            given = {"default": option.default}
        fields[name] = (kind, Field(**given, **shown))
    return create_model("LaunchSettings", __base__=_LaunchSettings, __module__=__name__, **fields)


def _raising(check: Callable[[Any], str | None]) -> Callable[[Any], Any]:
    def checked(value: Any) -> Any:
        if (error := check(value)) is not None:
            raise ValueError(error)
        return value

    return checked
