"""The checks that preprocessing's and scoring's parameters make alike: an image size within
bounds, and inputs and outputs that are a local path or ``s3://bucket/prefix``."""

from __future__ import annotations

from hvdflow.infra.storage.uris import parse_uri

# 8x8 digits up to large photos; beyond, a typo (an extra zero) runs every executor out of memory.
IMAGE_SIDE_RANGE = (2, 4096)


def check_image_size(size: tuple[int, int]) -> tuple[int, int]:
    """``size`` (height, width) unless a side is outside IMAGE_SIDE_RANGE."""
    low, high = IMAGE_SIDE_RANGE
    if not all(low <= side <= high for side in size):
        raise ValueError(
            f"image_size {tuple(size)} is out of bounds: each side must be between {low} "
            f"and {high} pixels (height, width)"
        )
    return size


def check_output(output: str) -> str:
    """``output`` unless it is neither a local path nor s3://bucket/prefix."""
    if output.startswith("s3://"):
        check_s3_uri(output, "output")
    elif "://" in output:
        raise ValueError(f"output {output!r}: expected a local path or s3://bucket/prefix")
    return output


def check_s3_uri(uri: str, name: str) -> None:
    """ValueError naming ``name`` unless ``uri`` is s3://bucket/prefix with a valid bucket."""
    try:
        bucket, _key = parse_uri(uri.rstrip("/") + "/x")
    except ValueError:
        raise ValueError(f"{name} {uri!r}: expected s3://bucket/prefix") from None
    if len(bucket) < 3:
        raise ValueError(f"{name} {uri!r}: bucket names have at least 3 characters")
