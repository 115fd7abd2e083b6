"""Object URIs and the paths beside them: one parser for ``s3://`` URIs, and joins and URLs
that work the same for a local folder and an ``s3://`` prefix."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

S3_SCHEME = "s3://"


def is_s3(url: str) -> bool:
    return url.startswith(S3_SCHEME)


def parse_uri(uri: str, *, key_required: bool = True) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``. A prefix (``key_required=False``)
    may be empty: ``s3://bucket`` -> ``("bucket", "")``."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc or (key_required and not parsed.path.strip("/")):
        shape = "s3://BUCKET/KEY" if key_required else "s3://BUCKET/PREFIX"
        raise ValueError(f"{uri!r} is not an object URI: expected {shape}")
    return parsed.netloc, parsed.path.lstrip("/")


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``; the prefix may be empty."""
    return parse_uri(uri, key_required=False)


def join(base: str, *parts: str) -> str:
    """``base/part/...`` for a local path or an ``s3://`` URI."""
    if is_s3(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(base, *parts)


def dataset_url(path: str) -> str:
    """The URL Petastorm opens: ``file://`` for a local folder, the ``s3://`` URI as it is."""
    return path if is_s3(path) else Path(os.path.abspath(path)).as_uri()
