#!/usr/bin/env bash
# `make test`: the classic suite on its xdist workers and, beside it from the start, the current
# profile's tests in one process of their own. Run after the classic suite, the current tests
# kept the two cores only ~60% busy (they wait on servers, ranks and a fresh install) and added
# 4:24 to a 20:20 run; beside it they fill the classic suite's idle share (~20%, vmstat).
# Their output goes to a file, printed when both have ended. Tests that take machine-wide ports
# wait for each other across the two sessions (tests/conftest.py, MACHINE_WIDE_GROUPS).
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
log=build/test-current.log
echo "[test] the current profile's tests run beside the classic suite; their output: $log"
# A subshell that execs: a plain `cmd &` would start with SIGINT ignored, and Ctrl-C would leave
# the current session running.
(exec make --no-print-directory test-current WORKERS=0 >"$log" 2>&1) &
current=$!
make --no-print-directory test-classic
classic_rc=$?
wait "$current"
current_rc=$?
echo
echo "[test] ---- the current profile's tests (run beside the classic suite) ----"
cat "$log"
echo "[test] classic suite: exit $classic_rc; current profile's tests: exit $current_rc"
if [ "$classic_rc" -ne 0 ]; then exit "$classic_rc"; fi
exit "$current_rc"
