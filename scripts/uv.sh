#!/usr/bin/env bash
# Prints the path of a uv of the version hvdflow's environments are made with, installing it
# once into a cache outside the clone when this machine has none.
#
# Where to look, in order: $UV (a uv of the user's own, any version that reads our locks);
# `uv` on PATH when it is this version; the cache; else `pip install uv==VERSION` into a small
# venv in the cache, made with the first Python 3 found. uv cannot download Python builds here
# (only package registries are reachable): scripts/setup.sh hands it the interpreter.
set -euo pipefail

UV_VERSION=0.13.8
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/hvdflow/uv-$UV_VERSION
log() { printf '[uv] %s\n' "$*" >&2; }

if [ -n "${UV:-}" ]; then
  echo "$UV"
  exit 0
fi
if command -v uv >/dev/null 2>&1 && [ "$(uv --version | cut -d' ' -f2)" = "$UV_VERSION" ]; then
  command -v uv
  exit 0
fi
if [ -x "$CACHE/bin/uv" ]; then
  echo "$CACHE/bin/uv"
  exit 0
fi

python=$(command -v python3.11 || command -v python3) \
  || { log "no python3 to install uv with: install uv $UV_VERSION and set UV=/path/to/uv"; exit 1; }
log "installing uv $UV_VERSION into $CACHE (once)"
# uv is one static binary: pip puts it in <target>/bin, which moves into place whole, so a set-up
# that dies half way leaves no uv that looks installed.
mkdir -p "${CACHE%/*}"
partial=$(mktemp -d "${CACHE%/*}/.uv-partial.XXXXXX")
"$python" -m pip install -q --disable-pip-version-check --no-warn-script-location \
    --root-user-action=ignore \
    --target "$partial" "uv==$UV_VERSION" >&2 \
  || { rm -rf "$partial"; log "could not install uv $UV_VERSION from the package index"; exit 1; }
mv -T "$partial" "$CACHE" 2>/dev/null || rm -rf "$partial"  # another set-up beat us to it
echo "$CACHE/bin/uv"
