"""What a scoring run reads, with which model (``ModelRef``), and where its predictions go
(``ScoreConfig``, built once from the flow's parameters)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hvdflow.infra.storage.uris import is_s3
from hvdflow.infra.tracking import CHAMPION
from hvdflow.tasks.config import DEFAULT_REGISTERED_MODEL
from hvdflow.tasks.images.checks import check_image_size, check_output, check_s3_uri

# "images": a folder or s3:// prefix of image files (any depth); "dataset": Parquet files with
# `image` (encoded bytes) and `source` columns, such as a split or version preprocessing wrote.
ScoreInputFormat = Literal["images", "dataset"]


class ModelRef(BaseModel):
    """A registered model version: ``models:/<name>@<alias>`` or ``models:/<name>/<version>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(default=DEFAULT_REGISTERED_MODEL, min_length=1)
    alias: str = Field(default=CHAMPION, min_length=1)
    version: str = Field(default="", description="a version number; wins over the alias")

    @field_validator("version")
    @classmethod
    def _version_number(cls, version: str) -> str:
        if version and not version.isdigit():
            raise ValueError(
                f"version {version!r} is not a version number: expected e.g. '3' (or leave it "
                "empty and give an alias)"
            )
        return version

    @model_validator(mode="after")
    def _alias_or_version(self) -> ModelRef:
        if self.version and "alias" in self.model_fields_set:
            raise ValueError(
                f"alias {self.alias!r} and version {self.version!r} both given: name one "
                "model version, by alias or by number"
            )
        return self

    @property
    def uri(self) -> str:
        if self.version:
            return f"models:/{self.name}/{self.version}"
        return f"models:/{self.name}@{self.alias}"

    @classmethod
    def from_uri(cls, uri: str) -> ModelRef:
        """``models:/<name>@<alias>``, ``models:/<name>/<version>`` or ``models:/<name>`` (its
        champion); ValueError for anything else."""
        path = uri.removeprefix("models:/")
        if path == uri or not path:
            raise ValueError(
                f"model URI {uri!r}: expected models:/<name>@<alias> or models:/<name>/<version>"
            )
        if "@" in path:
            name, alias = path.rsplit("@", 1)
            return cls(name=name, alias=alias)
        if "/" in path:
            name, version = path.rsplit("/", 1)
            return cls(name=name, version=version)
        return cls(name=path)


class ScoreConfig(BaseModel):
    """What to score and where the predictions go; checked when built."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str = Field(description="a folder every executor sees, or s3://bucket/prefix/")
    input_format: ScoreInputFormat = "images"
    output: str = Field(
        default="",
        description="a folder every executor sees, or s3://bucket/prefix/; empty: "
        "HVDFLOW_HOME/scores/<model name>",
    )
    # None: the model's own input size and colours (raw images are resized to them).
    image_size: tuple[int, int] | None = None
    color_mode: Literal["L", "RGB"] | None = None
    batch_size: int = Field(default=64, ge=1, description="images per predict call")
    max_pixels: int = Field(default=50_000_000, gt=0)
    max_bad_fraction: float = Field(default=0.1, ge=0.0, le=1.0)

    @field_validator("input")
    @classmethod
    def _input_exists(cls, value: str) -> str:
        if is_s3(value):
            check_s3_uri(value, "input")  # listed (and its existence checked) when scoring starts
        elif "://" in value:
            raise ValueError(
                f"input {value!r}: expected a folder every Spark executor can read (a shared "
                "file system), or s3://bucket/prefix"
            )
        elif not os.path.isdir(value):
            raise ValueError(
                f"input {value!r} is not an existing folder: give the folder of images "
                "(input_format 'images') or of Parquet files ('dataset')"
            )
        return value

    @field_validator("output")
    @classmethod
    def _output_syntax(cls, value: str) -> str:
        return check_output(value)

    @model_validator(mode="after")
    def _sane_size(self) -> ScoreConfig:
        if self.image_size is not None:
            check_image_size(self.image_size)
        return self
