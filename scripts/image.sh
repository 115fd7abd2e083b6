#!/usr/bin/env bash
# hvdflow's container image of a profile (container/Dockerfile), tagged hvdflow:PROFILE:
#
#   bash scripts/image.sh classic        # or `make image PROFILE=classic`; or current
#
# Stages the build context in a temporary folder: the profile's lock, the wheels the lock needs
# that no index serves (the machine's find-links, such as PyTorch's CPU build; Horovod, built
# once by scripts/setup.sh against the lock's TensorFlow), uv, and hvdflow's own wheel, built
# from this checkout. The base is HVDFLOW_IMAGE_BASE (default debian:bookworm-slim) where a
# registry serves it, else hvdflow-base:bookworm, made once from Debian's packages (debootstrap).
# The machine's CA bundle reaches the build as a secret (in no layer). IMAGE_PYTHON builds the
# wheel (default .venv/bin/python). Prints the image's tag.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-classic}
# Each profile's Debian: the one whose python3 is the profile's Python, and its Java.
case "$PROFILE" in
  classic) SUITE=bookworm JAVA=17 ;;
  current) SUITE=trixie JAVA=21 ;;
  *) echo "image: profile '$PROFILE' has no image; expected classic or current" >&2; exit 2 ;;
esac
TAG=${HVDFLOW_IMAGE:-hvdflow:$PROFILE}
CA=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
log() { printf '[image] %s\n' "$*" >&2; }
# shellcheck source=scripts/docker.sh
source scripts/docker.sh
docker_engine

base=${HVDFLOW_IMAGE_BASE:-debian:$SUITE-slim}
if ! docker image inspect "$base" >/dev/null 2>&1 \
   && ! timeout 60 docker pull -q "$base" >/dev/null 2>&1; then
  base=hvdflow-base:$SUITE
  if ! docker image inspect "$base" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null \
      || { log "no registry serves the base image and debootstrap is missing: bash scripts/setup.sh docker"; exit 1; }
    log "no registry serves ${HVDFLOW_IMAGE_BASE:-debian:$SUITE-slim}: making $base from Debian's packages (once)"
    root=$(mktemp -d)
    debootstrap --variant=minbase "$SUITE" "$root" http://deb.debian.org/debian >"$root.log" 2>&1 \
      || { tail -5 "$root.log" >&2; rm -rf "$root" "$root.log"; exit 1; }
    tar -C "$root" -c . | docker import - "$base" >/dev/null
    rm -rf "$root" "$root.log"
  fi
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
stage=$context/stage
mkdir -p "$stage"/{requirements,find-links,horovod,hvdflow}
cp container/Dockerfile "$context/"
cp "requirements/$PROFILE.txt" "$stage/requirements/"
cp "$(bash scripts/uv.sh)" "$stage/uv"
# The lock's packages with a local version (+cpu, +hvdflow.1): only the machine's find-links
# and scripts/petastorm-wheel.sh's folder hold them.
links="${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}"
[ "$PROFILE" != classic ] || links="$links $(bash scripts/petastorm-wheel.sh)"
for pin in $(grep -oE '^[A-Za-z0-9_.-]+==[^ ]+\+[^ ]+' "requirements/$PROFILE.txt" || true); do
  name=${pin%%==*} version=${pin#*==} found=
  for dir in $links; do
    found=$(ls "$dir/${name//-/_}-$version"-*.whl 2>/dev/null | head -1 || true)
    [ -z "$found" ] || break
  done
  [ -n "$found" ] || { log "$pin: no wheel in the find-links ($links)"; exit 1; }
  cp -l "$found" "$stage/find-links/" 2>/dev/null || cp "$found" "$stage/find-links/"
done
if [ "$PROFILE" = classic ]; then
  tf=$(grep -oE '^tensorflow-cpu==[^ ]+' requirements/classic.txt | cut -d= -f3)
  wheels=${HVDFLOW_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdflow/wheels}
  ls "$wheels"/horovod-*-tf-"$tf"-cp311-gloo/horovod-*.whl >/dev/null 2>&1 \
    || { log "no Horovod wheel built against TensorFlow $tf yet: bash scripts/setup.sh classic builds it"; exit 1; }
  cp "$wheels"/horovod-*-tf-"$tf"-cp311-gloo/horovod-*.whl "$stage/horovod/"
fi
# hvdflow's wheel from a copy of what the sdist holds (the checkout gets no build/ folder).
source=$context/source
mkdir "$source"
dirs=$(python3 -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"]; print(" ".join(sorted(set(d.values()))))')
cp -r pyproject.toml README.md $dirs "$source/"
find "$source" -name __pycache__ -prune -exec rm -rf {} +
"${IMAGE_PYTHON:-.venv/bin/python}" -m pip wheel -q --no-deps --no-build-isolation -w "$stage/hvdflow" "$source" 2>/dev/null

# BuildKit (for the build secret and uv's cache): a client of 23 or newer needs its buildx
# plugin for it; Debian's docker.io client (20.10) has it built in.
client=docker
if ! docker buildx version >/dev/null 2>&1 && [ -x /usr/bin/docker ]; then client=/usr/bin/docker; fi
log "building $TAG from $base"
nocache=()
[ "${HVDFLOW_IMAGE_NO_CACHE:-0}" != 1 ] || nocache=(--no-cache)  # every layer anew
DOCKER_BUILDKIT=1 "$client" build "${nocache[@]}" --network host --secret "id=ca,src=$CA" \
  --build-arg "BASE=$base" --build-arg "PROFILE=$PROFILE" --build-arg "JAVA=$JAVA" \
  -t "$TAG" "$context" >&2
# What older builds left: hvdflow's untagged images, and the builder's cache beyond a bound (the
# newest records stay, so the next build of the same lock reuses its layers).
docker image prune -f --filter label=org.opencontainers.image.title=hvdflow >/dev/null
docker builder prune -f --keep-storage "${HVDFLOW_BUILD_CACHE:-20GB}" >/dev/null 2>&1 || true
echo "$TAG"
