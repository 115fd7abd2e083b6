#!/usr/bin/env bash
# Petastorm as the classic profile installs it, made once into a folder outside the clone, whose
# path this prints (scripts/uv-env.sh adds it to uv's find-links; scripts/image.sh stages it).
#
# Petastorm 0.13.1 (its last release) declares setuptools<70, and the profile's PyTorch 2.13
# setuptools>=77.0.3. Petastorm's bound is stale: its only use of the setuptools family is
# distutils.version.LooseVersion, which setuptools 80 still provides (the suite's Petastorm
# readers pass beside it). So that the environment holds together as `pip check` reads it, the
# profile installs 0.13.1+hvdflow.1: the published wheel's files, unchanged, with that one
# requirement written as `setuptools` and the local version saying that the metadata is ours.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.13.1
LOCAL=hvdflow.1
DIR=${HVDFLOW_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdflow/wheels}/local
WHEEL="$DIR/petastorm-$VERSION+$LOCAL-py2.py3-none-any.whl"
if [ -f "$WHEEL" ]; then
  echo "$DIR"
  exit 0
fi

UV=$(bash scripts/uv.sh)
python=$(command -v python3.11 || command -v python3)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The published wheel's files, from the package index uv is configured with, as they install.
env -u UV_COMPILE_BYTECODE "$UV" pip install --quiet --no-deps --python "$python" \
  --target "$scratch/files" "petastorm==$VERSION" >&2
"$python" - "$scratch/files" "$VERSION" "$LOCAL" "$scratch/petastorm.whl" <<'PY'
import base64
import hashlib
import sys
import zipfile
from pathlib import Path

files, version, local, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
old, new = f"petastorm-{version}.dist-info", f"petastorm-{version}+{local}.dist-info"
# What an installer adds to a dist-info is not part of the wheel.
installed = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "uv_cache.json"}
metadata = (files / old / "METADATA").read_text()
assert "Requires-Dist: setuptools<70\n" in metadata, "petastorm's metadata changed: look again"
metadata = metadata.replace(f"\nVersion: {version}\n", f"\nVersion: {version}+{local}\n", 1)
metadata = metadata.replace("Requires-Dist: setuptools<70\n", "Requires-Dist: setuptools\n")

entries = {}
for path in sorted(files.rglob("*")):
    relative = path.relative_to(files)
    if path.is_dir() or relative.parts[0] == old and relative.name in installed:
        continue
    if relative.parts[0] not in ("petastorm", old) or "__pycache__" in relative.parts:
        continue
    name = str(relative).replace(old, new, 1)
    entries[name] = metadata.encode() if relative == Path(old, "METADATA") else path.read_bytes()
record = []
for name, data in entries.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append(f"{new}/RECORD,,")
entries[f"{new}/RECORD"] = ("\n".join(record) + "\n").encode()
with zipfile.ZipFile(out, "w") as wheel:
    for name, data in entries.items():
        info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        wheel.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
PY
mkdir -p "$DIR"
mv "$scratch/petastorm.whl" "$WHEEL"
printf '[petastorm] made %s\n' "$WHEEL" >&2
echo "$DIR"
