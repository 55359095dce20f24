#!/usr/bin/env bash
# Set up (if needed), run the whole test suite, then validate the bundled SmolLM2 build with
# `lantern validate` (ci/validate.sh). The SmolLM2 build happens once per run; LANTERN_CACHE keeps
# downloads and builds (default: .lantern-cache in the checkout). Extra arguments go to pytest
# and skip the validation step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
export LANTERN_CACHE="${LANTERN_CACHE:-$PWD/.lantern-cache}"
.venv/bin/python -m pytest -p no:cacheprovider -ra "$@"
if [ "$#" -eq 0 ]; then
  VALIDATE_ARGS="${VALIDATE_ARGS:---max-tokens 16 --ppl-tokens 64}" bash ci/validate.sh
fi
