"""What preprocessing is asked to do (``PreprocessConfig``) and what it published
(``DatasetManifest``): the values every part of the step passes around."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hvdflow.infra.storage.uris import is_s3

# Row groups per split when a dataset is for fewer ranks: datasets built for np <= 8 are shared.
MIN_ROW_GROUPS = 8


class PreprocessConfig(BaseModel):
    """What to read, how to turn it into training images, and where to write them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str  # a folder every executor sees, or s3://bucket/prefix/
    input_format: Literal["folders", "mnist_idx", "digits"] = "folders"
    output: str = "data/datasets"
    image_size: tuple[int, int] = (28, 28)  # (height, width)
    color_mode: Literal["L", "RGB"] = "L"
    val_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    seed: int = 0
    max_pixels: int = Field(default=50_000_000, gt=0)
    max_bad_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    # The most ranks that will read the dataset (the launcher's |np|): every split needs at least
    # one row group per rank. Splits are cut into ``row_groups`` where they have the rows.
    np: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _digits_are_local(self) -> PreprocessConfig:
        if self.input_format == "digits" and is_s3(self.input):
            raise ValueError(
                f"input {self.input!r}: input_format 'digits' writes the bundled digits to a "
                "local folder; give a folder path, or 'folders'/'mnist_idx' for images in a bucket"
            )
        return self

    @property
    def row_groups(self) -> int:
        """Row groups each split is cut into at least (where it has the rows): one per rank,
        and never fewer than MIN_ROW_GROUPS, so one dataset serves every np up to that."""
        return max(MIN_ROW_GROUPS, self.np)

    def params(self) -> dict:
        """What decides the content besides the input files: part of the fingerprint."""
        values = self.model_dump(exclude={"input", "output", "np"})
        # The row groups, under the name they had when they counted files per split: np <= 8
        # keeps the fingerprints, and so the datasets, that earlier versions wrote.
        values["files_per_split"] = self.row_groups
        return values


@dataclass(frozen=True)
class DatasetManifest:
    # The dataset's folder, holding train/, val/, labels.json and quarantine.csv (a local path
    # or s3:// URI): the published attempt, inside the version folder <output>/<fingerprint[:16]>
    # that holds manifest.json.
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
