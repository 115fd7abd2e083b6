"""What a file that no image reader accepts really is, from its first bytes.

A failed or rate-limited download leaves an HTML page or an error response under the image's
name; "not an image" alone sends the user looking for a codec problem. ``what_it_is`` never
fails: None means it does not know.
"""

from __future__ import annotations

import json
import re

# Bytes looked at to tell the kind of a document.
HEAD_BYTES = 4096
# Whole documents up to this size are parsed to tell JSON from text that starts with { or [.
JSON_PARSE_BYTES = 1 << 20
# Share of printable characters above which the first bytes are taken for text.
TEXT_SHARE = 0.95

HTML = "an HTML page, not an image (a failed or rate-limited download?)"
JSON = "a JSON document, not an image (an error response from an API, or a failed download?)"
XML = "an XML document, not an image (an error response from a server or object store?)"
SVG = "an SVG drawing, not a raster image: render it to PNG first"
PDF = "a PDF document, not an image"
HEIF = "a HEIF/HEIC photo, which Pillow cannot read: convert it to JPEG or PNG"
TEXT = "a text file, not an image"

_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
_HTML_TAG = re.compile(r"<(!doctype\s+html|html|head|body)[\s>]")
_JSON_START = re.compile(r'[{\[]\s*["{\[\]}0-9-]')
# ISO base media files whose major brand is HEIF (bytes 4-12: b"ftyp" and the brand).
_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis"}


def what_it_is(data: bytes) -> str | None:
    """The kind of document ``data`` is (a reason for the quarantine report), or None."""
    if data.startswith(b"%PDF-"):
        return PDF
    if data[4:8] == b"ftyp" and data[8:12] in _HEIF_BRANDS:
        return HEIF
    text = _as_text(data[:HEAD_BYTES])
    if text is None:
        return None
    start = text.lstrip().lower()
    if start.startswith("<"):
        if _HTML_TAG.search(start):
            return HTML
        if "<svg" in start:
            return SVG
        return XML
    if start.startswith(("{", "[")) and _is_json(data, start):
        return JSON
    return TEXT


def _as_text(head: bytes) -> str | None:
    """The first bytes as text (a byte order mark removed), None when they are not text."""
    encoding = "utf-8"
    for bom, codec in _BOMS:
        if head.startswith(bom):
            head, encoding = head[len(bom) :], codec
            break
    if encoding == "utf-8" and b"\0" in head:
        return None
    text = head.decode(encoding, errors="replace")
    if not text:
        return text
    printable = sum(c in "\t\n\r\f" or (c.isprintable() and c != "\ufffd") for c in text)
    return text if printable >= TEXT_SHARE * len(text) else None


def _is_json(data: bytes, start: str) -> bool:
    """A whole JSON document, or the start of one too long (or cut too short) to parse."""
    if len(data) <= JSON_PARSE_BYTES:
        try:
            json.loads(data)  # json detects UTF-8/16/32, with or without a byte order mark
            return True
        except (ValueError, UnicodeDecodeError):
            pass
    return bool(_JSON_START.match(start))
