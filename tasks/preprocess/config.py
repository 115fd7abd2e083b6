"""What preprocessing is asked to do and what it published: the data parameters a flow takes
(``DataParams``), the same as the step runs them (``PreprocessConfig``: paths resolved, the
ranks it serves), and the published dataset (``DatasetManifest``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hvdflow.infra.home import hvdflow_home
from hvdflow.tasks.images.checks import check_image_size, check_output, check_s3_uri

# Row groups per split when a dataset is for fewer ranks: datasets built for np <= 8 are shared.
MIN_ROW_GROUPS = 8
InputFormat = Literal["folders", "mnist_idx", "digits"]


class DataParams(BaseModel):
    """What to preprocess, and where the dataset goes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str = Field(
        default="",
        description="class-folder tree or MNIST IDX folder; empty with input_format 'digits': "
        "the bundled digits, written under HVDFLOW_HOME",
    )
    input_format: InputFormat = "digits"
    output: str = Field(
        default="",
        description="dataset root, a path or s3://bucket/prefix; empty: HVDFLOW_HOME/datasets",
    )
    image_size: tuple[int, int] = (8, 8)
    color_mode: Literal["L", "RGB"] = "L"
    image_encoding: Literal["png", "jpeg", "raw"] = Field(
        default="png",
        description="how the dataset stores each image: 'png' (lossless and compact; a GPU rank "
        "needs two to three cores to decode it), 'jpeg' (quality 95: lossy, a third of PNG's "
        "bytes, cheaper to decode) or 'raw' (the uint8 pixels: nothing to decode, about 2x PNG's "
        "bytes; read by the pyarrow reader only, Petastorm's cannot)",
    )
    val_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    max_bad_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    split_seed: int = 0

    @field_validator("image_size")
    @classmethod
    def _sane_size(cls, size: tuple[int, int]) -> tuple[int, int]:
        return check_image_size(size)

    @field_validator("output")
    @classmethod
    def _output_syntax(cls, output: str) -> str:
        return check_output(output)

    @model_validator(mode="after")
    def _input_exists(self) -> DataParams:
        if self.input.startswith("s3://"):
            check_s3_uri(self.input, "input")
            if self.input_format == "digits":
                raise ValueError(
                    f"input {self.input!r}: input_format 'digits' writes the bundled digits to "
                    "a local folder; use 'folders' (class sub-folders) or 'mnist_idx' for "
                    "images in a bucket"
                )
            return self  # listed (and its existence checked) when preprocessing starts
        if "://" in self.input:
            raise ValueError(
                f"input {self.input!r}: expected a folder every Spark executor can read (a "
                "shared file system), or s3://bucket/prefix"
            )
        if self.input_format == "digits":
            return self  # the bundled digits are written there on first use
        if not self.input:
            raise ValueError(
                f"input is empty: input_format={self.input_format!r} needs the folder that "
                "holds the images (or use input_format='digits' for the bundled digits)"
            )
        if not os.path.isdir(self.input):
            raise ValueError(
                f"input {self.input!r} is not an existing folder: give the folder of class "
                "sub-folders (input_format='folders') or of MNIST IDX files ('mnist_idx')"
            )
        return self

    def preprocess_config(self, ranks: int = 1) -> PreprocessConfig:
        """The preprocessing step's config for training with ``ranks`` ranks."""
        return PreprocessConfig(**self.model_dump(), np=abs(ranks))


class PreprocessConfig(DataParams):
    """The data parameters as the preprocessing step runs them: empty paths are HVDFLOW_HOME's;
    plus the ranks it serves and a decoding bound."""

    # The most ranks that will read the dataset (the launcher's |np|).
    np: int = Field(default=1, ge=1)
    max_pixels: int = Field(default=50_000_000, gt=0)  # a decompression bomb is quarantined

    @model_validator(mode="before")
    @classmethod
    def _resolve_paths(cls, values):
        if isinstance(values, dict) and not (values.get("input") and values.get("output")):
            home = hvdflow_home()
            values = dict(values)
            if not values.get("input") and values.get("input_format", "digits") == "digits":
                values["input"] = str(home / "data" / "digits")
            values["output"] = values.get("output") or str(home / "datasets")
        return values

    @property
    def seed(self) -> int:
        """The split's seed (``split_seed``): which records go to validation, and the order."""
        return self.split_seed

    @property
    def row_groups(self) -> int:
        """Row groups each split gets at least (where it has the rows): one per rank, and never
        fewer than MIN_ROW_GROUPS, so one dataset serves every np up to that."""
        return max(MIN_ROW_GROUPS, self.np)

    def params(self) -> dict:
        """What decides the content besides the input files: part of the fingerprint."""
        values = self.model_dump(exclude={"input", "output", "np", "split_seed"})
        if values["image_encoding"] == "png":  # PNG datasets keep the fingerprints they had
            del values["image_encoding"]
        # Under their old names, so np <= 8 keeps the fingerprints earlier versions wrote.
        values["seed"] = self.split_seed
        values["files_per_split"] = self.row_groups
        return values


@dataclass(frozen=True)
class DatasetManifest:
    # The published attempt's folder (train/, val/, labels.json, quarantine.csv), inside the
    # version folder <output>/<fingerprint[:16]> that holds manifest.json.
    path: str
    fingerprint: str
    train_url: str
    val_url: str
    train_rows: int
    val_rows: int
    quarantined: int
    label_map: dict[str, int]
    image_shape: tuple[int, ...]
    quarantine_path: str
    attempt: str = ""  # the attempt folder inside `path` whose files are the dataset
    train_row_groups: int = 0
    val_row_groups: int = 0
    reused: bool = False

    @property
    def num_classes(self) -> int:
        return len(self.label_map)

    @property
    def class_names(self) -> tuple[str, ...]:
        """The class names in the order of the model's outputs (label index 0, 1, ...)."""
        return tuple(name for name, _ in sorted(self.label_map.items(), key=lambda kv: kv[1]))
