#!/usr/bin/env bash
# The machine's tools that only the tests need (`make test` runs this; `make run` does not).
# Each one is installed with Debian's apt when missing and this runs as root; without it, the
# tests that need it skip (and fail under CI=true).
set -euo pipefail
log() { printf '[setup] %s\n' "$*" >&2; }

install_if_missing() {  # command, Debian package, what needs it
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    log "no $1 here, and installing $2 needs root and apt: $3 will skip (fail under CI=true)"
    return 0
  fi
  log "installing $2 (for $3)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "$2" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq "$2" >/dev/null; } \
    || log "could not install $2: $3 will skip (fail under CI=true)"
}

# The multi-host tests (tests/cluster) simulate hosts with network namespaces: root and `ip`.
install_if_missing ip iproute2 "the multi-host tests"
# The browser tests (tests/ui) drive Debian's chromium headless through playwright, which is told
# to use it (playwright's own browser downloads cannot be reached here).
install_if_missing chromium chromium "the browser tests"

# The suite writes checkpoints, datasets and models to a real SeaweedFS on this disk; with a few
# GB left its uploads fail ("failed to find writable volumes") and look like regressions.
# uv's cache is what fills it: it keeps every source it ever unpacked, and a proxy that strips
# cache headers (this machine's) makes it unpack pyspark's 650 MB again on each online fetch.
# When the disk runs short, drop what nothing in that cache uses (`uv cache prune`: the entries
# no environment or lookup points to; it removed 57 GB here, in 15 s) before saying so.
free_gb() { df -Pk . | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
free=$(free_gb)
if [ "$free" -lt 20 ]; then
  uv=$(bash scripts/uv.sh)
  log "disk: ${free} GB free; pruning uv's cache of what nothing uses ($uv cache prune)"
  "$uv" cache prune --quiet || log "uv cache prune failed; going on"
  free=$(free_gb)
fi
log "disk: ${free} GB free here"
if [ "$free" -lt 10 ]; then
  log "only ${free} GB free: the object-store tests need ~10 GB; free some (old clones, other caches) before testing"
  [ "${CI:-}" != true ] || exit 1
fi
