#!/usr/bin/env bash
# Sets up hvdflow's environment for one profile, from the project's own files, on a fresh
# machine or again: `scripts/setup.sh [classic|current|airflow]` (default: $PROFILE, else
# classic). Each profile installs exactly its lock, requirements/<profile>.txt (scripts/lock.sh
# compiles them from pyproject.toml), with uv (scripts/uv.sh installs it once), then hvdflow
# itself, editable.
#
# - classic: .venv, Python 3.11: TensorFlow 2.15, Horovod built here, Petastorm with pyarrow 14,
#   tensorflow-addons, PyTorch's CPU build: the mission's Horovod path, and the torch tests.
# - current: .venv-current, Python 3.13 (scripts/python.sh finds or builds it, into a cache
#   outside the clone): the newest releases the index serves; no Horovod, Petastorm or
#   tensorflow-addons; the engine is tf_collective.
# - client: .venv-client, Python 3.13: the thin orchestrator worker for Spark Connect
#   (pyspark-client, Prefect, MLflow's client; no Java, TensorFlow, torch or full pyspark) and
#   hvdflow without its dependencies (docs/connect.md, "A thin worker").
# - client-classic: .venv-client-classic, Python 3.11: the same thin worker for the classic
#   profile's executors (a client's Python must be the executors' minor version).
# - airflow: .venv-airflow, Python 3.11, Airflow 3.3 alone and hvdflow without its dependencies:
#   Airflow's own environment, as a user's Airflow has it. The DAGs import hvdflow.airflow there;
#   their tasks run in another profile's environment (HVDFLOW_PYTHON). Airflow does not resolve
#   beside the classic pins (docs/airflow.md, "Installing: two environments").
#
# uv keeps one cache for every clone and profile and links packages from it (scripts/uv-env.sh).
# Each lock is installed once per machine into a template environment under
# ~/.cache/hvdflow/envs (HVDFLOW_ENV_CACHE), bytecode and Horovod included, and a clone's
# environment is made of hardlinks to it: seconds and almost no disk. The slow part of
# classic is horovod: it has no wheel on PyPI and must be compiled against the installed
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
    ;;
  current)
    VENV=.venv-current
    # PYTHON_CURRENT: a Python 3.13 of the user's own; else found or built (scripts/python.sh).
    PYTHON=${PYTHON_CURRENT:-$(bash scripts/python.sh 3.13)}
    ;;
  airflow)
    PYTHON=${PYTHON:-python3.11}
    VENV=.venv-airflow
    ;;
  client)
    VENV=.venv-client
    PYTHON=${PYTHON_CURRENT:-$(bash scripts/python.sh 3.13)}
    ;;
  client-classic)
    VENV=.venv-client-classic
    PYTHON=${PYTHON:-python3.11}
    ;;
  docker)
    # Not an environment: Debian's Docker engine and debootstrap, for the container image
    # (scripts/image.sh) and its tests, installed with apt where they are missing.
    missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    if [ ${#missing[@]} -gt 0 ]; then
      [ "$(id -u)" = 0 ] || { log "installing ${missing[*]} needs root: sudo apt-get install ${missing[*]}"; exit 1; }
      log "installing ${missing[*]} with apt (once)"
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
    fi
    log "ready: $(dockerd --version), $(debootstrap --version 2>/dev/null | head -1 || echo debootstrap)"
    exit 0
    ;;
  torch)
    log "PROFILE=torch: PyTorch is in the classic profile now (make run; make test)"
    exit 2
    ;;
  *) log "PROFILE=$PROFILE: expected classic, current, airflow, client, client-classic or docker"; exit 2 ;;
esac
LOCK="requirements/$PROFILE.txt"
HOROVOD_VERSION=0.28.1
TF_VERSION=2.15.1
WHEEL_CACHE=${HVDFLOW_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdflow/wheels}
STAMP="$VENV/.hvdflow-setup"

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

# Everything that decides the environment's content; a change to any of it installs again.
want=$(cat pyproject.toml "$LOCK" scripts/setup.sh scripts/python.sh scripts/uv.sh scripts/uv-env.sh \
         scripts/petastorm-wheel.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  log "environment up to date ($VENV)"
  exit 0
fi

UV=$(bash scripts/uv.sh)
# shellcheck source=scripts/uv-env.sh
source scripts/uv-env.sh
# The interpreter itself, not a launcher in front of it (a pyenv shim costs every process a shell).
python=$("$PYTHON" -c "import sys; print(sys.executable)")
UVPIP=("$UV" pip --quiet)

# What `uv pip check` finds broken in the environment VIRTUAL_ENV names.
broken() { "$UV" pip check 2>&1 | grep '^The package' || true; }
# The classic profile's Petastorm is a local build (scripts/petastorm-wheel.sh says why).
if [ "$PROFILE" = classic ]; then
  UV_FIND_LINKS="${UV_FIND_LINKS:+$UV_FIND_LINKS,}$(bash scripts/petastorm-wheel.sh)"
  export UV_FIND_LINKS
fi

# The profile's packages are installed once per machine into a template environment outside
# the clone, keyed by what decides them (the lock, the interpreter, uv's
# scripts, TEMPLATE_VERSION); each clone's environment is a copy of it made of hardlinks:
# seconds, and almost no disk. uv links the packages from its cache anyway; what the template
# saves each clone is their bytecode (about 400 MB and half a minute of compiling per
# environment) and the Horovod check.
# TEMPLATE_VERSION: raise it when what goes into a template changes here (not for comments,
# which would otherwise cost every machine its templates again).
TEMPLATE_VERSION=1
ENVS=${HVDFLOW_ENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdflow/envs}
key=$( { cat "$LOCK" scripts/uv.sh scripts/uv-env.sh scripts/petastorm-wheel.sh
         echo "$TEMPLATE_VERSION $HOROVOD_VERSION $TF_VERSION"
         "$python" -c 'import sys; print(sys.executable, sys.version)'; } | sha256sum | cut -c1-16)
TEMPLATE="$ENVS/$PROFILE-$key"

install_horovod() {
  local env=$1
  PY_TAG=$("$env/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  WHEEL_DIR="$WHEEL_CACHE/horovod-$HOROVOD_VERSION-tf-$TF_VERSION-$PY_TAG-gloo"
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    log "building horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (once; about 9 minutes)"
    local build_dir
    build_dir=$(mktemp -d)
    # System cmake: PyPI's cmake 4.x rejects gloo's cmake_minimum_required. pip (from the lock's
    # dev extra) builds it: horovod's setup.py must see the installed TensorFlow.
    PATH="/usr/bin:$PATH" \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
      "$env/bin/python" -m pip --disable-pip-version-check wheel --no-build-isolation \
        --no-deps --no-cache-dir "horovod==$HOROVOD_VERSION" -w "$build_dir" \
        >"$build_dir/build.log" 2>&1 \
      || { tail -40 "$build_dir/build.log" >&2; log "horovod build failed (full log above)"; exit 1; }
    # Publish atomically: a build that dies half way must not look like a cached wheel.
    mkdir -p "$WHEEL_CACHE"
    local tmp_dir
    tmp_dir=$(mktemp -d "$WHEEL_CACHE/.partial.XXXXXX")
    cp "$build_dir"/horovod-*.whl "$tmp_dir"/
    mv -T "$tmp_dir" "$WHEEL_DIR" 2>/dev/null || rm -rf "$tmp_dir"
    rm -rf "$build_dir"
  else
    log "using cached horovod wheel from $WHEEL_DIR"
  fi
  VIRTUAL_ENV="$env" "${UVPIP[@]}" install --no-deps "$WHEEL_DIR"/horovod-*.whl

  log "checking horovod (TensorFlow + Gloo)"
  TF_CPP_MIN_LOG_LEVEL=3 "$env/bin/python" - <<'PY'
import horovod.tensorflow as hvd
hvd.init()
assert hvd.gloo_built(), "horovod was built without Gloo"
import horovod
print(f"[setup] horovod {horovod.__version__}: gloo={hvd.gloo_built()} mpi={hvd.mpi_built()} size={hvd.size()}")
PY
}

if [ ! -d "$TEMPLATE" ]; then
  mkdir -p "$ENVS"
  partial=$(mktemp -d "$ENVS/.partial-$PROFILE-XXXXXX")
  trap 'rm -rf "$partial"' EXIT
  log "installing $LOCK into a template environment (once per lock: $TEMPLATE)"
  "$UV" venv --quiet --allow-existing --python "$python" "$partial"
  VIRTUAL_ENV="$partial" "${UVPIP[@]}" sync "$LOCK"
  [ "$PROFILE" != classic ] || install_horovod "$partial"
  # Published atomically: a set-up that dies half way leaves nothing that looks like a template.
  mv -T "$partial" "$TEMPLATE" 2>/dev/null || rm -rf "$partial"  # a set-up beside this one won
  trap - EXIT
  # This profile's older templates go: the clones made from them hold hardlinks, not references.
  find "$ENVS" -mindepth 1 -maxdepth 1 -name "$PROFILE-*" ! -path "$TEMPLATE" \
    -exec rm -rf {} + 2>/dev/null || true
fi

# The clone's environment: a new venv (its own interpreter links, activate scripts and
# pyvenv.cfg), the template's files hardlinked in, its commands copied with their first line
# pointing at this venv's Python, then hvdflow itself, editable (its dependencies are all in the
# lock already). Made anew whenever the stamp differs: nothing in it is worth keeping.
log "making $VENV from the template"
rm -rf "$VENV"
"$UV" venv --quiet --python "$python" "$VENV"
rm -rf "$VENV/lib" "$VENV/include" "$VENV/share"
for part in lib include share; do
  # Hardlinks need one file system; across two it is a copy (slower, same result).
  [ ! -e "$TEMPLATE/$part" ] || cp -al "$TEMPLATE/$part" "$VENV/$part" 2>/dev/null \
    || { rm -rf "${VENV:?}/$part"; cp -a "$TEMPLATE/$part" "$VENV/$part"; }
done
"$python" - "$TEMPLATE/bin" "$VENV/bin" <<'PY'
import os
import shutil
import sys

template, venv = sys.argv[1:]
python = os.path.join(os.path.abspath(venv), "python")
# A first line longer than the kernel reads (127 bytes) goes through sh, as pip and uv write it.
if len(python) < 125:
    shebang = f"#!{python}\n"
else:
    shebang = "#!/bin/sh\n'''exec' '" + python + "' \"$0\" \"$@\"\n' '''\n"
for name in os.listdir(template):
    source, dest = os.path.join(template, name), os.path.join(venv, name)
    if os.path.lexists(dest):  # the venv's own: python, activate scripts
        continue
    if os.path.islink(source):
        os.symlink(os.readlink(source), dest)
        continue
    with open(source, "rb") as f:
        content = f.read()
    first, _, body = content.partition(b"\n")
    if not (first.startswith(b"#!") and b"python" in first or first == b"#!/bin/sh"
            and body.startswith(b"'''exec'")):
        # Not a Python command: a binary (SeaweedFS's weed, 150 MB; ruff) or a shell script.
        try:
            os.link(source, dest)
        except OSError:  # another file system
            shutil.copy2(source, dest)
        continue
    if first == b"#!/bin/sh":
        body = body.split(b"\n", 2)[2]  # the long form: its exec lines go
    with open(dest, "wb") as f:
        f.write(shebang.encode() + body)
    shutil.copymode(source, dest)
PY
export VIRTUAL_ENV="$PWD/$VENV"  # which environment uv pip works on
"${UVPIP[@]}" install --no-deps -e .

if [ "$PROFILE" = airflow ] || [ "$PROFILE" = client ] || [ "$PROFILE" = client-classic ]; then
  # The environment's own requirements must hold; hvdflow's are missing here by design.
  problems=$(broken | grep -v 'The package `hvdflow`' || true)
  [ -z "$problems" ] || { printf '%s\n' "$problems" >&2; log "$VENV is broken"; exit 1; }
  echo "$want" > "$STAMP"
  log "ready: $VENV ($PROFILE: hvdflow without its dependencies)"
  exit 0
fi

# Every requirement holds, as `pip check` reads them.
problems=$(broken)
[ -z "$problems" ] || { printf '%s\n' "$problems" >&2; log "$VENV does not hold together"; exit 1; }
echo "$want" > "$STAMP"
log "ready: $VENV (profile $PROFILE)"
