#!/usr/bin/env bash
# Set up a fresh Debian machine for Lantern: system packages, a Python venv, npm packages.
# Idempotent: re-running skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v chromium >/dev/null || need_apt+=(chromium)
command -v emcc >/dev/null || need_apt+=(emscripten)
if ((${#need_apt[@]})); then
  echo "== apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
echo "== pip install -e .[test]"
.venv/bin/pip install -q --upgrade pip 2>&1 | grep -v WARNING || true
.venv/bin/pip install -q -e ".[test]" 2>&1 | grep -v WARNING || true
.venv/bin/python -c "import lantern, tvm, playwright" # fail early if the install did not take

echo "== npm ci (webruntime)"
(cd webruntime && npm ci --no-audit --no-fund --silent)

echo "== npm run build (webruntime -> webruntime/dist)"
(cd webruntime && npm run build --silent)
