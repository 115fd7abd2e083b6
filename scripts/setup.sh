#!/usr/bin/env bash
# Sets up hvdflow's environment for one profile, from the project's own files, on a fresh
# machine or again: `scripts/setup.sh [classic|current|torch|airflow]` (default: $PROFILE, else
# classic).
#
# - classic: .venv, Python 3.11, requirements/classic.txt (TensorFlow 2.15, Horovod built here,
#   Petastorm with pyarrow 14, tensorflow-addons): the mission's Horovod path.
# - current: .venv-current, Python 3.13 (scripts/python.sh finds or builds it, into a cache
#   outside the clone), requirements/current.txt (the newest releases the index serves): no
#   Horovod, Petastorm or tensorflow-addons; the engine is tf_collective.
# - torch: .venv-torch, Python 3.11, requirements/torch.txt: classic's pins plus PyTorch's CPU
#   build, without Petastorm, Horovod or tensorflow-addons (torch needs setuptools>=77,
#   petastorm setuptools<70).
# - airflow: .venv-airflow, Python 3.11, Airflow 3.3 alone (requirements/airflow.txt) and hvdflow
#   without its dependencies: Airflow's own environment, as a user's Airflow has it. The DAGs
#   import hvdflow.airflow there; their tasks run in another profile's environment
#   (HVDFLOW_PYTHON). Airflow does not resolve beside the classic pins (README, "For Airflow users").
#
# The slow part of classic is horovod: it has no wheel on PyPI and must be compiled against the installed
# TensorFlow (about 9 minutes on 2 cores). The wheel is built once into a cache outside the clone,
# keyed by horovod, TensorFlow and Python versions, so a second set-up installs it in seconds.
# A wheel built against another TensorFlow fails at import (HorovodVersionMismatchError), which
# is why TensorFlow's version is part of the key.
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${1:-${PROFILE:-classic}}
log() { printf '[setup] %s\n' "$*" >&2; }
case "$PROFILE" in
  classic)
    PYTHON=${PYTHON:-python3.11}
    VENV=.venv
    EXTRAS="dev,profile,petastorm,addons"
    ;;
  torch)
    # PyTorch beside the classic stack less Petastorm and Horovod (their pins conflict with
    # torch's: pyproject.toml, the torch extra); the TorchDistributor and torch tests run here.
    PYTHON=${PYTHON:-python3.11}
    VENV=.venv-torch
    EXTRAS="dev,torch"
    ;;
  current)
    VENV=.venv-current
    EXTRAS="dev"
    # PYTHON_CURRENT: a Python 3.13 of the user's own; else found or built (scripts/python.sh).
    PYTHON=${PYTHON_CURRENT:-$(bash scripts/python.sh 3.13)}
    ;;
  airflow)
    PYTHON=${PYTHON:-python3.11}
    VENV=.venv-airflow
    ;;
  *) log "PROFILE=$PROFILE: expected classic, current, torch or airflow"; exit 2 ;;
esac
CONSTRAINTS="requirements/$PROFILE.txt"
HOROVOD_VERSION=0.28.1
TF_VERSION=2.15.1
WHEEL_CACHE=${HVDFLOW_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdflow/wheels}
STAMP="$VENV/.hvdflow-setup"

# The multi-host tests (tests/cluster) simulate hosts with network namespaces: they need root
# and iproute2's `ip`. Without either they skip (and fail under CI=true).
if ! command -v ip >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  log "installing iproute2 (for the multi-host tests)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq iproute2 >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq iproute2 >/dev/null; } \
    || log "could not install iproute2: the multi-host tests will skip (fail under CI=true)"
fi

# The browser tests (tests/ui) drive Debian's chromium headless through playwright, which is told
# to use it (playwright's own browser downloads cannot be reached here). Without it they skip
# (and fail under CI=true).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  log "installing chromium (for the browser tests)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq chromium >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; } \
    || log "could not install chromium: the browser tests will skip (fail under CI=true)"
fi

# Editors and type checkers (docs/layout.md) read imports from files: they cannot run the
# import hook that maps hvdflow.<room> to the rooms at the top of the checkout in an editable
# install. build/editors holds the same map as links (hvdflow/ with each room linked inside it),
# which pyproject's [tool.pyright] and [tool.mypy] point them to; nothing imports from it at run
# time. Rooms are linked as whole folders, so a new module shows at once; a new room or a new
# file in hvdflow/ is linked by the next set-up, which is why this runs before the check below.
# A failure here costs editors their map, not the set-up.
"$PYTHON" - <<'PY' || log "could not link the rooms into build/editors (editors, type checkers)"
import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

root = Path.cwd()
tree = root / "build" / "editors"
rooms = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def links():
    for package, folder in rooms.items():
        dest = Path(*package.split("."))
        if any(other.startswith(f"{package}.") for other in rooms):
            # A package with rooms inside it (hvdflow/): a real folder, its own files linked.
            for entry in sorted((root / folder).iterdir()):
                if entry.name != "__pycache__" and f"{package}.{entry.name}" not in rooms:
                    yield dest / entry.name, entry
        else:
            yield dest, root / folder


want = {str(link): os.path.relpath(target, tree / link.parent) for link, target in links()}
have = {}
for folder, dirs, files in os.walk(tree):
    for name in dirs + files:
        if os.path.islink(path := os.path.join(folder, name)):
            have[os.path.relpath(path, tree)] = os.readlink(path)
if have != want:
    tree.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=".editors-", dir=tree.parent))
    fresh.chmod(0o755)
    for link, target in want.items():
        (fresh / link).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, fresh / link)
    stale = fresh.with_name(f"{fresh.name}-old")
    try:
        tree.rename(stale)
    except FileNotFoundError:
        pass
    try:
        fresh.rename(tree)
    except OSError:  # a set-up running beside this one put its own (the same) in place first
        shutil.rmtree(fresh)
    shutil.rmtree(stale, ignore_errors=True)
    print("[setup] linked the rooms into build/editors (editors, type checkers)", file=sys.stderr)
PY

# Everything that decides the environment's content; a change to any of it reinstalls.
want=$(cat pyproject.toml "$CONSTRAINTS" scripts/setup.sh scripts/python.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  log "environment up to date ($VENV)"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip wheel "setuptools<81"
if [ "$PROFILE" = airflow ]; then
  log "installing Airflow ($CONSTRAINTS) and hvdflow without its dependencies"
  "${PIP[@]}" install -q -r "$CONSTRAINTS"
  "${PIP[@]}" install -q --no-deps -e .
  # Airflow's own requirements must hold; hvdflow's are missing here by design.
  problems=$("${PIP[@]}" check 2>&1 | grep -v -e '^hvdflow ' -e '^No broken' || true)
  [ -z "$problems" ] || { printf '%s\n' "$problems" >&2; log "Airflow's environment is broken"; exit 1; }
  echo "$want" > "$STAMP"
  log "ready: $VENV (Airflow's environment)"
  exit 0
fi
log "installing the $PROFILE profile's dependencies ($CONSTRAINTS)"
"${PIP[@]}" install -q -c "$CONSTRAINTS" -e ".[$EXTRAS]"

if [ "$PROFILE" != classic ]; then
  "${PIP[@]}" check
  echo "$want" > "$STAMP"
  log "ready: $VENV (profile $PROFILE)"
  exit 0
fi

PY_TAG=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEEL_DIR="$WHEEL_CACHE/horovod-$HOROVOD_VERSION-tf-$TF_VERSION-$PY_TAG-gloo"
if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
  log "building horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (once; about 9 minutes)"
  build_dir=$(mktemp -d)
  trap 'rm -rf "$build_dir"' EXIT
  # System cmake: PyPI's cmake 4.x rejects gloo's cmake_minimum_required.
  PATH="/usr/bin:$PATH" \
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    "${PIP[@]}" wheel --no-build-isolation --no-deps --no-cache-dir \
      "horovod==$HOROVOD_VERSION" -w "$build_dir" >"$build_dir/build.log" 2>&1 \
    || { tail -40 "$build_dir/build.log" >&2; log "horovod build failed (full log above)"; exit 1; }
  # Publish atomically: a build that dies half way must not look like a cached wheel.
  mkdir -p "$WHEEL_CACHE"
  tmp_dir=$(mktemp -d "$WHEEL_CACHE/.partial.XXXXXX")
  cp "$build_dir"/horovod-*.whl "$tmp_dir"/
  mv -T "$tmp_dir" "$WHEEL_DIR" 2>/dev/null || rm -rf "$tmp_dir"
else
  log "using cached horovod wheel from $WHEEL_DIR"
fi
"${PIP[@]}" install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl

log "checking horovod (TensorFlow + Gloo)"
"$VENV/bin/python" - <<'PY'
import horovod.tensorflow as hvd
hvd.init()
assert hvd.gloo_built(), "horovod was built without Gloo"
import horovod
print(f"[setup] horovod {horovod.__version__}: gloo={hvd.gloo_built()} mpi={hvd.mpi_built()} size={hvd.size()}")
PY
"${PIP[@]}" check
echo "$want" > "$STAMP"
log "ready: $VENV"
