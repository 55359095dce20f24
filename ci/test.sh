#!/usr/bin/env bash
# Set up (if needed), run the whole test suite, then validate the bundled SmolLM2 build with
# `lantern validate` (ci/validate.sh). The SmolLM2 build happens once per run; LANTERN_CACHE keeps
# downloads and builds (default: .lantern-cache in the checkout). Extra arguments go to pytest
# and skip the validation step. The time of each phase is printed at the end, pass or fail.
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
export LANTERN_CACHE="${LANTERN_CACHE:-$PWD/.lantern-cache}"
phase tests .venv/bin/python -m pytest -p no:cacheprovider -ra --durations=25 "$@"
if [ "$#" -eq 0 ]; then
  export VALIDATE_ARGS="${VALIDATE_ARGS:---max-tokens 16 --ppl-tokens 64}"
  phase validate bash ci/validate.sh
fi
