#!/usr/bin/env bash
# Runs a command with every core kept busy by a CPU-burning loop beside it (one per core, killed when the
# command ends), the condition under which the suite must still pass: a CI machine shared with other work.
#   bash tests/under_load.sh make test
#   RUNS=20 bash tests/under_load.sh .venv/bin/python -m pytest -q -n 0 tests/test_distributed.py -k outlives
# RUNS=N repeats the command N times under the same load and prints how many passed; exit status 0 only if all did.
# HOGS=N: N loops instead of one per core.
set -uo pipefail
[ $# -gt 0 ] || { echo "under_load.sh: expected a command to run" >&2; exit 2; }
hogs=()
hog_count=${HOGS:-$(getconf _NPROCESSORS_ONLN)}
for _ in $(seq "$hog_count"); do
  ( while :; do :; done ) &
  hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
runs=${RUNS:-1} passed=0
for i in $(seq "$runs"); do
  if "$@"; then passed=$((passed + 1)); fi
  [ "$runs" -gt 1 ] && echo "under_load.sh: run $i of $runs: $passed passed so far"
done
[ "$runs" -gt 1 ] && echo "under_load.sh: $passed of $runs runs passed, $hog_count busy loops beside them"
[ "$passed" -eq "$runs" ]
