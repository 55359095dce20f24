#!/usr/bin/env bash
# Set up (if needed), build the bundled SmolLM2-135M-Instruct into dist/smollm2 and serve the demo
# site, the runtime, the model and the OpenAI-compatible API on http://127.0.0.1:${PORT:-8000}/.
#   QUANT     weight format (default q4f32_1)
#   SCHEDULE  WebGPU kernel schedules: both (default: the browser picks cpu-emulated on a software
#             adapter, gpu on a real GPU), gpu or cpu-emulated
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/lantern build smollm2 --quant "${QUANT:-q4f32_1}" --webgpu-schedule "${SCHEDULE:-both}" --out dist/smollm2
exec .venv/bin/lantern serve dist/smollm2 --port "${PORT:-8000}"
