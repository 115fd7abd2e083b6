"""Executor side of preprocessing: a partition's input items in, dataset rows or quarantine
records out.

``decode_records`` reads and decodes the items with the task's ``Fetcher``
(``hvdflow.tasks.images.fetch``), gives each usable image its label index and split key and
encodes it as the dataset stores it (a ``Row``); unusable inputs come out as ``Bad`` records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hvdflow.infra.storage.access import S3Access
from hvdflow.infra.storage.uris import is_s3
from hvdflow.tasks.images.decode import Bad
from hvdflow.tasks.images.encode import encode_image
from hvdflow.tasks.images.fetch import Fetcher, check_input_root
from hvdflow.tasks.preprocess.schema import image_shape
from hvdflow.tasks.preprocess.split import split_key


class Row(NamedTuple):
    """A usable image, ready to store: its label index, split key and PNG bytes."""

    source: str
    label: int
    key: int
    image: bytes


@dataclass(frozen=True)
class DecodePlan:
    """What every decode task needs, as plain values (it travels in the Spark closure)."""

    image_size: tuple[int, int]
    color_mode: str
    max_pixels: int
    seed: int
    label_index: dict[str, int]
    root: str  # the input folder (checked on every executor) or s3:// prefix
    access: S3Access | None  # for s3:// inputs
    encoding: str = "png"  # data.image_encoding


def decode_records(items, plan: DecodePlan, client=None):
    """Row or Bad records for ``items`` (``hvdflow.tasks.images.listing.Item``), in order;
    ``client``: the partition's boto3 client, if it has one already."""
    if not is_s3(plan.root):
        check_input_root(plan.root)
    shape = image_shape(plan.image_size, plan.color_mode)
    with Fetcher(plan.access, client) as fetcher:
        records = fetcher.records(items, plan.image_size, plan.color_mode, plan.max_pixels)
        for record in records:
            if isinstance(record, Bad):
                yield record
                continue
            label = plan.label_index.get(record.label)
            if label is None:
                known = ", ".join(plan.label_index)
                yield Bad(
                    record.source,
                    f"label {record.label!r} is not one of the classes ({known})",
                )
                continue
            image = encode_image(record.image, shape, plan.encoding)
            yield Row(record.source, label, split_key(plan.seed, record.source), image)
