#!/usr/bin/env bash
# Model validation as plain shell, only `lantern` commands: build the bundled SmolLM2 and check it
# in headless Chromium against ci/budget.toml. Reports land in test-output/. Exit 1 on a breached
# budget, 2 when the validation could not run. The same steps as ci/github-workflow.yml.
#   SCHEDULE  WebGPU kernel schedules to build (default both: the browser picks cpu-emulated on a
#             software adapter such as a hosted runner's SwiftShader, gpu on a real GPU)
#   VALIDATE_ARGS  extra `lantern validate` arguments
set -euo pipefail
cd "$(dirname "$0")/.."
LANTERN="${LANTERN:-.venv/bin/lantern}"
mkdir -p test-output
"$LANTERN" build smollm2 --quant q4f32_1 --webgpu-schedule "${SCHEDULE:-both}" --out dist/smollm2-validate
# shellcheck disable=SC2086
"$LANTERN" validate dist/smollm2-validate --budget ci/budget.toml \
  --json test-output/validate.json --junit test-output/validate.xml ${VALIDATE_ARGS:-}
