#!/usr/bin/env bash
# Set up a fresh Debian machine for Lantern: system packages, a Python venv, npm packages.
# Idempotent: re-running skips what is already there.
# Prints the step names and, when a step fails, its output; nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."

quiet() {  # quiet COMMAND...: run COMMAND; show its output only if it fails
  local log
  log=$(mktemp)
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "== failed: $*" >&2
    return 1
  fi
  rm -f "$log"
}

need_apt=()
command -v chromium >/dev/null || need_apt+=(chromium)
command -v emcc >/dev/null || need_apt+=(emscripten)
if ((${#need_apt[@]})); then
  echo "== apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  quiet apt-get update
  quiet apt-get install -y "${need_apt[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  quiet python3 -m venv .venv
fi
echo "== pip install -e .[test]"
quiet .venv/bin/pip install --upgrade pip
quiet .venv/bin/pip install -e ".[test]"
.venv/bin/python -c "import lantern, tvm, playwright" # fail early if the install did not take

echo "== npm ci (webruntime)"
(cd webruntime && quiet npm ci --no-audit --no-fund)

echo "== npm run build (webruntime -> webruntime/dist)"
(cd webruntime && quiet npm run build)
