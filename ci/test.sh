#!/usr/bin/env bash
# Set up (if needed), lint (ci/lint.sh), then run the whole test suite; tests/test_validate.py runs ci/validate.sh
# (build and `lantern validate` the bundled SmolLM2) among them. The SmolLM2 build happens once per
# run; LANTERN_CACHE keeps downloads and builds (default: .lantern-cache in the checkout). Extra
# arguments go to pytest. The time of each phase is printed at the end, pass or fail.
set -euo pipefail
cd "$(dirname "$0")/.."

PHASES=()
phase() {  # phase NAME COMMAND...: run COMMAND, remember how long it took
  local name=$1 start=$SECONDS
  shift
  "$@" || { local rc=$?; PHASES+=("$name $((SECONDS - start))s (failed)"); return $rc; }
  PHASES+=("$name $((SECONDS - start))s")
}
report() {
  echo "== time per phase (total ${SECONDS}s):"
  printf '   %s\n' "${PHASES[@]}"
}
trap report EXIT

phase setup bash ci/setup.sh
phase lint bash ci/lint.sh
export LANTERN_CACHE="${LANTERN_CACHE:-$PWD/.lantern-cache}"
# One pytest worker per core (at most 4; LANTERN_TEST_WORKERS overrides), each taking whole test files
# in the order conftest.py sorts them; builds shared between files are made once (the cache is locked).
workers=${LANTERN_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}
phase tests .venv/bin/python -m pytest -p no:cacheprovider -ra --durations=25 \
  -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
