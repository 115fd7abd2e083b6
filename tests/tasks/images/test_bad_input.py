"""Input that still broke preprocessing (and scoring, which lists, reads and decodes alike):
every fault made for real on disk (symbolic links, permissions, named pipes, images written by
Pillow) and the exact outcome asserted."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hvdflow.tasks.images import sniff
from hvdflow.tasks.images.decode import Bad, Good, decode_image
from hvdflow.tasks.images.fetch import PERMISSION_DENIED, decode_item
from hvdflow.tasks.images.listing import list_class_folders
from hvdflow.tasks.images.walk import PERMISSION_DENIED_FOLDER

REPO = Path(__file__).resolve().parents[3]
EXIF_ORIENTATION = 0x0112
# How a viewer turns the stored pixels upright for an EXIF orientation (PIL turns
# counter-clockwise: orientation 6 is "turn 90 degrees clockwise to view").
UPRIGHT = {6: Image.Transpose.ROTATE_270, 8: Image.Transpose.ROTATE_90}

F_MODE = (
    "unsupported image mode 'F' (32-bit floating-point samples, whose range is unknown: no "
    "scaling to 8 bits is safe): convert it to 8- or 16-bit grayscale, RGB or RGBA"
)
I_MODE = (
    "unsupported image mode 'I' (32-bit or signed integer samples, whose range is unknown: no "
    "scaling to 8 bits is safe): convert it to 8- or 16-bit grayscale, RGB or RGBA"
)


def png(path, value=128, size=(6, 4)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", size, value).save(path)
    return path


def symlink(path, target):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)
    return path


def listed(root):
    """(source, label, problem) of every listed item, in order."""
    return [(i.source, i.label, i.problem) for i in list_class_folders(str(root)).items]


def decode(path, image_size, color_mode="L", max_pixels=10**6):
    data = Path(path).read_bytes()
    return decode_image(Path(path).name, "c", data, image_size, color_mode, max_pixels)


def sixteen_bit_gradient(height=10, width=12):
    """Unsigned 16-bit samples over the whole range, the extremes included."""
    values = np.linspace(0, 65535, height * width).round().astype(np.uint16)
    values[0], values[-1] = 0, 65535
    return values.reshape(height, width)


def write_16_bit(path, values, kind):
    """A real 16-bit grayscale file: PNG (Pillow: I;16), big-endian TIFF (I;16B) or PGM (I)."""
    if kind == "tiff-big-endian":
        Image.fromarray(values.astype(">u2")).save(path, "TIFF")
    else:
        Image.fromarray(values).save(path, {"png": "PNG", "pgm": "PPM"}[kind])
    return path


def write_cmyk_jpeg(path, cmyk, adobe=True, size=(16, 8)):
    """A one-colour CMYK JPEG. Adobe's (as Pillow and Photoshop write it): inverted samples and
    an APP14 "Adobe" marker. Plain: the samples as they are, no marker."""
    if adobe:
        Image.new("CMYK", size, cmyk).save(path, quality=95)
        return path
    # Pillow writes inverted samples: give it the inverse, then drop the marker that says so.
    out = io.BytesIO()
    Image.new("CMYK", size, tuple(255 - v for v in cmyk)).save(out, "JPEG", quality=95)
    data = out.getvalue()
    at = data.index(b"\xff\xee")  # APP14
    length = int.from_bytes(data[at + 2 : at + 4], "big")
    assert data[at + 4 : at + 9] == b"Adobe"
    path.write_bytes(data[:at] + data[at + 2 + length :])
    return path


def write_exif_rotated(path, orientation, width=16, height=8):
    """A JPEG stored sideways (width x height) with the EXIF Orientation that turns it upright:
    in the stored pixels the left half is bright, the right half dark."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[:, : width // 2] = 240
    pixels[:, : width // 2, 0] = np.arange(height)[:, None] * 20  # no two rows alike
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    Image.fromarray(pixels, "RGB").save(path, quality=95, exif=exif.tobytes())
    return path


# --- 1. symbolic links ---------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.timeout(30)  # a walk that follows a folder cycle would never end
def test_broken_and_looping_links_are_listed_with_their_reason_and_good_links_kept(tmp_path):
    root = tmp_path / "images"
    png(root / "cat" / "a.png")
    png(root / "dog" / "b.png")
    png(root / "cat" / "sub" / "c.png")
    png(tmp_path / "elsewhere" / "d.png")
    png(root / "cat" / ".hidden.png")
    symlink(root / "cat" / "broken.jpg", "missing.jpg")
    symlink(root / "cat" / "loop1.jpg", "loop2.jpg")
    symlink(root / "cat" / "loop2.jpg", "loop1.jpg")
    symlink(root / "cat" / "self.jpg", "self.jpg")
    symlink(root / "cat" / "link.png", "../dog/b.png")  # a good link to an image
    symlink(root / "cat" / "more", "../../elsewhere")  # a good link to a folder of images
    symlink(root / "cat" / "sub" / "up", "..")  # a folder cycle: back to cat
    symlink(root / "cat" / "sub" / "top", "../..")  # ... and to the input folder
    symlink(root / "cat" / "zz_copy", "sub")  # a second way into sub
    symlink(root / "zoo", ".")  # a "class folder" that is the input folder

    assert listed(root) == [
        ("cat/a.png", "cat", None),
        (
            "cat/broken.jpg",
            "cat",
            "broken symbolic link: it points to 'missing.jpg', which does not exist",
        ),
        ("cat/link.png", "cat", None),
        (
            "cat/loop1.jpg",
            "cat",
            "symbolic link loop: it points to 'loop2.jpg', and following the links never "
            "reaches a file",
        ),
        (
            "cat/loop2.jpg",
            "cat",
            "symbolic link loop: it points to 'loop1.jpg', and following the links never "
            "reaches a file",
        ),
        (
            "cat/self.jpg",
            "cat",
            "symbolic link loop: it points to 'self.jpg', and following the links never "
            "reaches a file",
        ),
        (
            "cat/zz_copy",
            "cat",
            "a second path to the folder 'cat/sub': its files are listed once, under that path",
        ),
        ("cat/more/d.png", "cat", None),
        ("cat/sub/c.png", "cat", None),
        (
            "cat/sub/top",
            "cat",
            "symbolic link loop: it points to '../..', a folder that contains it",
        ),
        ("cat/sub/up", "cat", "symbolic link loop: it points to '..', a folder that contains it"),
        ("dog/b.png", "dog", None),
        ("zoo", "zoo", "symbolic link loop: it points to '.', a folder that contains it"),
    ]
    listing = list_class_folders(str(root))
    assert listing.labels == ["cat", "dog"]  # zoo has nothing to decode
    assert list_class_folders(str(root)) == listing  # the same tree lists the same way
    # The good links are read through: the image behind cat/link.png decodes.
    (link,) = [i for i in listing.items if i.source == "cat/link.png"]
    (record,) = decode_item(link, (4, 6), "L", 10**6)
    assert isinstance(record, Good) and record.image.shape == (4, 6)
    # Fixing a broken link changes the fingerprint: the dataset is made again.
    before = [f for f in listing.files if f[0].endswith("broken.jpg")]
    png(root / "cat" / "missing.jpg")
    after = [f for f in list_class_folders(str(root)).files if f[0].endswith("broken.jpg")]
    assert before != after and after[0][1] == (root / "cat" / "missing.jpg").stat().st_size


@pytest.mark.unit
@pytest.mark.timeout(30)  # opening the pipe to read it would wait forever
def test_a_named_pipe_is_quarantined_and_never_opened(tmp_path):
    png(tmp_path / "cat" / "a.png")
    os.mkfifo(tmp_path / "cat" / "pipe.png")
    listing = list_class_folders(str(tmp_path))
    records = [r for item in listing.items for r in decode_item(item, (4, 6), "L", 10**6)]
    assert [type(r).__name__ for r in records] == ["Good", "Bad"]
    assert records[1] == Bad(
        "cat/pipe.png", "not a regular file but a named pipe: it is never read"
    )


# --- 2. permissions ----------------------------------------------------------------------------

# Lists the tree in argv[1] and decodes every item, in a process of its own: prints
# [source, reason or "ok"] for each.
_LIST_AND_DECODE = """
import json, sys
from hvdflow.tasks.images.decode import Bad
from hvdflow.tasks.images.fetch import decode_item
from hvdflow.tasks.images.listing import list_class_folders
out = []
for item in list_class_folders(sys.argv[1]).items:
    for record in decode_item(item, (4, 6), "L", 10**6):
        out.append([record.source, record.reason if isinstance(record, Bad) else "ok"])
print(json.dumps(out))
"""


def run_without_file_access_bypass(args):
    """Run a command that file permissions apply to. As root they do not (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH): then it runs with every capability dropped (setpriv)."""
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip(
                "tests run as root, which reads any file, and setpriv (util-linux) to "
                "drop that capability is not installed"
            )
        args = [setpriv, "--inh-caps=-all", "--bounding-set=-all", *args]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60, check=True)


@pytest.mark.integration
def test_unreadable_files_and_folders_are_quarantined_as_permission_denied(tmp_path):
    root = tmp_path / "images"
    png(root / "cat" / "ok.png")
    secret = png(root / "cat" / "secret.png")
    locked = png(root / "cat" / "locked" / "inside.png").parent
    secret.chmod(0)
    locked.chmod(0)
    try:
        done = run_without_file_access_bypass([sys.executable, "-c", _LIST_AND_DECODE, str(root)])
    finally:
        secret.chmod(0o644)
        locked.chmod(0o755)
    assert json.loads(done.stdout) == [
        ["cat/ok.png", "ok"],
        ["cat/secret.png", PERMISSION_DENIED],
        ["cat/locked", PERMISSION_DENIED_FOLDER],
    ]
    assert PERMISSION_DENIED.startswith("permission denied: ")
    assert "corrupt" not in PERMISSION_DENIED


# --- 3. pixel formats --------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kind", "mode"), [("png", "I;16"), ("tiff-big-endian", "I;16B"), ("pgm", "I")]
)
def test_16_bit_grayscale_is_scaled_to_8_bits_by_its_full_range(tmp_path, kind, mode):
    values = sixteen_bit_gradient()
    path = write_16_bit(tmp_path / f"deep.{kind}", values, kind)
    with Image.open(path) as opened:
        assert opened.mode == mode  # the fixture is what a 16-bit file opens as
    record = decode(path, values.shape)
    assert isinstance(record, Good)
    # round(value / 257): 0 -> 0, 65535 -> 255, exactly; no stretching per image.
    expected = ((values.astype(np.int64) + 128) // 257).astype(np.uint8)
    assert np.array_equal(record.image, expected)
    assert record.image.min() == 0 and record.image.max() == 255


@pytest.mark.unit
def test_8_bit_data_stored_in_16_bits_comes_back_exactly(tmp_path):
    eight = np.arange(256, dtype=np.uint16).reshape(16, 16)
    path = write_16_bit(tmp_path / "widened.png", eight * 257, "png")
    assert np.array_equal(decode(path, (16, 16)).image, eight.astype(np.uint8))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("pixels", "reason"),
    [
        (np.full((4, 4), 0.5, np.float32), F_MODE),
        (np.full((4, 4), 70_000, np.int32), I_MODE),  # 32-bit integer samples
        (np.full((4, 4), -3, np.int16), I_MODE),  # signed 16-bit samples
    ],
)
def test_samples_without_a_known_range_stay_quarantined_saying_why(tmp_path, pixels, reason):
    path = tmp_path / "ambiguous.tif"
    Image.fromarray(pixels).save(path)
    assert decode(path, (4, 4)) == Bad("ambiguous.tif", reason)


@pytest.mark.unit
@pytest.mark.parametrize("adobe", [True, False], ids=["adobe", "plain"])
def test_cmyk_jpegs_keep_their_colour(tmp_path, adobe):
    path = write_cmyk_jpeg(tmp_path / "red.jpg", (0, 255, 255, 0), adobe=adobe)
    with Image.open(path) as opened:
        assert opened.mode == "CMYK" and ("adobe" in opened.info) == adobe
    assert (b"\xff\xee\x00\x0eAdobe" in path.read_bytes()) == adobe  # APP14, 14 bytes
    rgb = decode(path, (8, 16), "RGB").image.astype(int)
    red, green, blue = rgb[..., 0].mean(), rgb[..., 1].mean(), rgb[..., 2].mean()
    assert red > 230 and green < 25 and blue < 25, (red, green, blue)


@pytest.mark.unit
@pytest.mark.parametrize("orientation", [6, 8])
def test_an_exif_rotated_photo_is_stored_upright(tmp_path, orientation):
    path = write_exif_rotated(tmp_path / "sideways.jpg", orientation)  # 16 wide, 8 high
    with Image.open(path) as opened:
        assert opened.size == (16, 8) and opened.getexif()[EXIF_ORIENTATION] == orientation
        upright = np.asarray(opened.convert("RGB").transpose(UPRIGHT[orientation]))
    record = decode(path, (16, 8), "RGB")  # (height, width): upright, so no resize
    assert record.image.shape == (16, 8, 3)
    assert np.array_equal(record.image, upright)
    # Bright half on top for 6 (turned clockwise), at the bottom for 8.
    top, bottom = record.image[:8].mean(), record.image[8:].mean()
    assert (top > 100 > bottom) if orientation == 6 else (bottom > 100 > top)


# --- 6. files that are no image ----------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (
            b"\xef\xbb\xbf \r\n<!DOCTYPE html>\n<html><body>Too Many Requests</body></html>",
            sniff.HTML,
        ),
        (b"<html>\n<head><title>403 Forbidden</title></head></html>", sniff.HTML),
        (b'<!-- cache miss -->\n<html lang="en"><body></body></html>', sniff.HTML),
        (b'  {"error": {"code": 429, "message": "rate limit exceeded"}}\n', sniff.JSON),
        (b'[{"id": 1}, {"id": 2}]', sniff.JSON),
        (b'{"error": "rate limit exceeded", "retry_af', sniff.JSON),  # cut short
        ('{"message": "slow down"}'.encode("utf-16"), sniff.JSON),
        (
            b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code></Error>',
            sniff.XML,
        ),
        (b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>', sniff.SVG),
        (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj", sniff.PDF),
        (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic", sniff.HEIF),
        (b"Rate limit exceeded. Try again later.\n", sniff.TEXT),
        (bytes(range(256)) * 4, "not an image file Pillow can read"),
    ],
    ids=[
        "html-bom-doctype",
        "html",
        "html-after-comment",
        "json-object",
        "json-array",
        "json-cut-short",
        "json-utf16",
        "xml-error",
        "svg",
        "pdf",
        "heic",
        "text",
        "binary",
    ],
)
def test_a_file_that_is_no_image_says_what_it_is(tmp_path, data, reason):
    path = tmp_path / "photo.jpg"
    path.write_bytes(data)
    assert decode(path, (4, 4)) == Bad("photo.jpg", reason)
