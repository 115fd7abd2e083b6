"""Horovod's performance knobs as one typed, frozen object, turned into each rank's environment."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hvdflow.infra import constants as c
from hvdflow.infra.secrets import (
    SECRET_NAME_PATTERN,
    SECRET_URL_PATTERN,
    check_reference,
    resolve,
)

logger = logging.getLogger(__name__)


class HorovodOptions(BaseModel):
    """Settings passed to every rank as the environment variables Horovod reads at ``hvd.init()``.

    Unset fields leave Horovod's own defaults in place.
    """

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
        description="send gradients as float16 in the allreduce (half the bytes on the wire, "
        "Horovod 0.16's compression); read by the training function, not an environment "
        "variable",
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
        """The environment variables for these settings, exactly as each rank gets them.

        Resolves ``extra_env``'s references (see ``hvdflow.infra.secrets``): call it only to launch.
        """
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
        env.update(
            {name: resolve(value, f"extra_env[{name!r}]") for name, value in self.extra_env.items()}
        )
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
