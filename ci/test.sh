#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. The SmolLM2 build happens once per run;
# LANTERN_CACHE keeps downloads and builds (default: .lantern-cache in the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
export LANTERN_CACHE="${LANTERN_CACHE:-$PWD/.lantern-cache}"
exec .venv/bin/python -m pytest -p no:cacheprovider -ra "$@"
