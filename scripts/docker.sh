# Sourced by scripts/image.sh and the container tests' harness: `docker_engine` points
# DOCKER_HOST at a Docker engine that answers, or fails in one line saying how to get one.
#
# In order: the engine DOCKER_HOST (or the client's default socket) names; else hvdflow's own,
# started as root from Debian's docker.io (`bash scripts/setup.sh docker` installs it) with a
# socket and data root under HVDFLOW_DOCKER_ROOT (default ~/.cache/hvdflow/docker, outside any
# clone: images built once per lock), no iptables and no bridge: containers use the host's
# network. It keeps running for the next build or test; `docker_engine_stop` stops it.

HVDFLOW_DOCKER_ROOT=${HVDFLOW_DOCKER_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdflow/docker}

docker_engine() {
  if command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; then
    return 0
  fi
  local sock="$HVDFLOW_DOCKER_ROOT/docker.sock"
  export DOCKER_HOST="unix://$sock"
  if timeout 10 docker info >/dev/null 2>&1; then
    return 0
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "no Docker engine answers (DOCKER_HOST=${DOCKER_HOST}) and dockerd is not installed:" \
      "run 'bash scripts/setup.sh docker' (Debian's docker.io, as root) or set DOCKER_HOST" \
      "to a running engine" >&2
    return 1
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "no Docker engine answers and starting one needs root: run as root, or set" \
      "DOCKER_HOST to a running engine (e.g. unix:///var/run/docker.sock)" >&2
    return 1
  fi
  mkdir -p "$HVDFLOW_DOCKER_ROOT"
  # setsid: the engine outlives this shell (the next build reuses it and its images).
  setsid dockerd --iptables=false --ip6tables=false --bridge=none \
    --data-root "$HVDFLOW_DOCKER_ROOT/data" --exec-root "$HVDFLOW_DOCKER_ROOT/exec" \
    --pidfile "$HVDFLOW_DOCKER_ROOT/docker.pid" -H "$DOCKER_HOST" \
    >"$HVDFLOW_DOCKER_ROOT/dockerd.log" 2>&1 </dev/null &
  local waited=0
  until timeout 5 docker info >/dev/null 2>&1; do
    if [ "$waited" -ge 60 ]; then
      echo "dockerd did not answer on $sock within 60 s; its log: $HVDFLOW_DOCKER_ROOT/dockerd.log" >&2
      tail -5 "$HVDFLOW_DOCKER_ROOT/dockerd.log" >&2
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
}

docker_engine_stop() {
  local pidfile="$HVDFLOW_DOCKER_ROOT/docker.pid"
  [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
}
