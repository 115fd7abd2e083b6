#!/usr/bin/env bash
# hvdflow's own trainers on this machine's GPUs, without Spark (scripts/gpu_check.py says what
# runs and how it is measured). For a GPU machine lent for minutes: runs on a bare checkout with
# whatever Python has PyTorch and/or TensorFlow, no install, no network:
#
#   bash scripts/gpu-check.sh --out gpu-check.json        # on the GPU machine
#   bash scripts/gpu-check.sh --tiny                      # seconds on a CPU (CI's smoke test)
#
# PYTHON picks the interpreter (default: python3). Where `hvdflow` is not importable, the
# checkout is made importable as the wheel lays it out (hvdflow.training is training/, ...)
# through links in a temporary folder, removed at exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

if ! (cd / && "$python" -c 'import hvdflow.training.spec' 2>/dev/null); then
  tree=$(mktemp -d "${TMPDIR:-/tmp}/hvdflow-import.XXXXXX")
  trap 'rm -rf "$tree"' EXIT
  mkdir "$tree/hvdflow"
  ln -s "$root"/hvdflow/*.py "$tree/hvdflow/"
  # The rooms as pyproject.toml maps them (hvdflow.<room> is <folder>/), not a second list.
  rooms=$("$python" -c 'import sys, tomllib
dirs = tomllib.load(open(sys.argv[1], "rb"))["tool"]["setuptools"]["package-dir"]
print(" ".join(k[len("hvdflow."):] + "=" + v for k, v in dirs.items() if k.count(".") == 1))' "$root/pyproject.toml")
  for room in $rooms; do ln -s "$root/${room#*=}" "$tree/hvdflow/${room%%=*}"; done
  export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}"
fi
# Not `exec`: the trap above removes the links once the check is done.
"$python" "$root/scripts/gpu_check.py" "$@"
