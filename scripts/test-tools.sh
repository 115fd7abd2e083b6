#!/usr/bin/env bash
# The machine's tools that only the tests need (`make test` runs this; `make run` does not):
# iproute2 for the multi-host harness, Chromium for the browser tests. Each one is installed with
# apt when missing and this runs as root; without it, those tests skip (and fail under CI=true).
set -euo pipefail
log() { printf '[setup] %s\n' "$*" >&2; }

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
