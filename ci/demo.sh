#!/usr/bin/env bash
# Set up (if needed) and build the bundled SmolLM2-135M-Instruct into dist/smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/lantern build smollm2 --quant "${QUANT:-q4f32_1}" --out dist/smollm2
