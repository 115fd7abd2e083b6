#!/usr/bin/env bash
# Compiles each profile's lock, requirements/<profile>.txt, from pyproject.toml's ranges and the
# profile's own choices (requirements/<profile>.in), with uv: `scripts/lock.sh [PROFILE...]`
# (default: all). A maintainer reruns it to upgrade (`make lock`; `UPGRADE=1` moves every pin to
# the newest release that resolves, otherwise the pins already in the lock are kept where they
# still fit) and commits the result; scripts/setup.sh installs exactly what the lock says.
# `scripts/lock.sh --check [PROFILE...]` changes nothing and fails when a lock is not what
# pyproject.toml and its .in file compile to (tests/test_locks.py runs it).
#
# The locks are for the machines the project runs on (Linux x86_64, glibc 2.28+), each for its
# profile's Python. PyTorch's CPU build is found through the machine's find-links (pip's
# configuration, as scripts/setup.sh reads it), the classic profile's Petastorm in the folder
# scripts/petastorm-wheel.sh makes it in.
set -euo pipefail
cd "$(dirname "$0")/.."

UV=$(bash scripts/uv.sh)
# shellcheck source=scripts/uv-env.sh
source scripts/uv-env.sh
upgrade=()
[ "${UPGRADE:-0}" = 1 ] && upgrade=(--upgrade)
check=0
if [ "${1:-}" = --check ]; then
  check=1
  shift
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

lock() {  # profile, Python version, extras...
  local profile=$1 python=$2
  shift 2
  local extras=()
  for extra in "$@"; do extras+=(--extra "$extra"); done
  local sources=(requirements/"$profile".in)
  # Airflow's and the thin client's environments hold hvdflow without its dependencies.
  case "$profile" in airflow|client*) ;; *) sources=(pyproject.toml "${sources[@]}") ;; esac
  local out=requirements/"$profile".txt
  if [ "$check" = 1 ]; then
    out="$scratch/$profile.txt"
    cp requirements/"$profile".txt "$out"  # its pins are the preferences, as in a real run
  fi
  printf '[lock] %s (Python %s)\n' "$profile" "$python" >&2
  local compile=("$UV" pip compile --quiet "${sources[@]}" "${extras[@]}" "${upgrade[@]}"
    --python-version "$python" --python-platform x86_64-manylinux_2_28
    --no-emit-find-links --no-header --annotation-style line
    --custom-compile-command "scripts/lock.sh $profile" -o "$out")
  # A check keeps the lock's pins, so what uv already has answers it: from its cache first.
  # Online, behind a proxy that strips cache headers, every check downloaded pyspark's 450 MB
  # source again and kept it unpacked as a new cache entry (about 650 MB a run).
  # A cache that answers with other pins may only be stale (emptied and partly refilled, it
  # knew an older boto3): then the index decides.
  if [ "$check" = 1 ] && "${compile[@]}" --offline 2>/dev/null \
    && diff -q <(pins requirements/"$profile".txt) <(pins "$out") >/dev/null; then
    :
  else
    [ "$check" = 0 ] || cp requirements/"$profile".txt "$out"  # the lock's pins again
    "${compile[@]}"
  fi
  if [ "$check" = 1 ]; then
    if ! diff <(pins requirements/"$profile".txt) <(pins "$out") >&2; then
      printf '[lock] requirements/%s.txt is not what pyproject.toml and requirements/%s.in compile to (above: < the lock, > compiled): run scripts/lock.sh %s and commit it\n' "$profile" "$profile" "$profile" >&2
      stale=1
    fi
    return
  fi
  # One line on top that says where the file comes from (uv's header would name this machine's
  # paths).
  { printf '# The %s profile'"'"'s lock: `scripts/lock.sh %s` compiles it from pyproject.toml and\n' "$profile" "$profile"
    printf '# requirements/%s.in (Python %s); scripts/setup.sh %s installs exactly this.\n' "$profile" "$python" "$profile"
    cat requirements/"$profile".txt; } > requirements/"$profile".txt.new
  mv requirements/"$profile".txt.new requirements/"$profile".txt
}

pins() { grep -v '^#' "$1" | sed 's/ .*//' | grep .; }

stale=0
profiles=("$@")
[ ${#profiles[@]} -gt 0 ] || profiles=(classic current airflow client client-classic)
for profile in "${profiles[@]}"; do
  case "$profile" in
    classic)
      UV_FIND_LINKS="${UV_FIND_LINKS:+$UV_FIND_LINKS,}$(bash scripts/petastorm-wheel.sh)" \
        lock classic 3.11 tensorflow-cpu dev profile petastorm addons torch docker ;;
    current) lock current 3.13 tensorflow dev connect ;;
    airflow) lock airflow 3.11 ;;
    client) lock client 3.13 ;;
    client-classic) lock client-classic 3.11 ;;
    *) printf '[lock] %s: expected classic, current, airflow, client or client-classic\n' "$profile" >&2; exit 2 ;;
  esac
done
exit "$stale"
