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

# The llamacpp engine's bindings (the pyproject's `llamacpp` extra) compile llama.cpp: ~4 minutes of
# both cores without the multimodal library. Start that first, in the background, while the steps
# below mostly wait on downloads; the wheel stays in $wheels for later runs and clones.
llama_spec=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["llamacpp"][0])')
# Native code for this CPU, but no AMX: where the hypervisor does not hand AMX state to the guest (seen
# here on a Firecracker VM whose CPU lists amx_int8), ggml's AMX kernels die of SIGILL in llama_decode.
amx_off="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# Without llamafile's sgemm, ggml computes a row the same alone or in a chunk, so the llamacpp engine's
# speculation checks drafts exactly (server/llamacpp.py); the cost is slower prefill (docs/benchmarks.md).
llama_cmake="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON -DGGML_LLAMAFILE=OFF -DLLAMA_OPENSSL=OFF '-DCMAKE_C_FLAGS=$amx_off' '-DCMAKE_CXX_FLAGS=$amx_off'"
llama_key=$(echo "$llama_spec $llama_cmake" | sha256sum | cut -c1-12)
# A wheel per spec and build flags, outside the checkout so that a fresh clone on the same machine
# (CI's) takes it instead of compiling again.
wheels=${LANTERN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lantern/wheels}/$llama_key
llama_pid=
llama_install=
if ! { [ -x .venv/bin/python ] && [ "$(cat .venv/llama-cpp-build 2>/dev/null)" = "$llama_key" ] &&
       .venv/bin/python -c "import llama_cpp" 2>/dev/null; }; then
  mkdir -p "$wheels"
  if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "== building $llama_spec in the background"
    # --no-cache-dir: pip's own wheel cache keys on the source, not on CMAKE_ARGS
    CMAKE_ARGS="$llama_cmake" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      python3 -m pip wheel --quiet --no-cache-dir --no-deps -w "$wheels" "$llama_spec" \
      >"$wheels/build.log" 2>&1 &
    llama_pid=$!
  fi
  llama_install=1
fi

need_apt=()
command -v chromium >/dev/null || need_apt+=(chromium)
command -v emcc >/dev/null || need_apt+=(emscripten)
# The other two engines the runtime is tested in: Firefox (Gecko) and WebKitGTK (WebKit, JavaScriptCore:
# Safari's engine), driven headless (WebKitWebDriver under a virtual screen)
command -v firefox-esr >/dev/null || need_apt+=(firefox-esr)
command -v WebKitWebDriver >/dev/null || need_apt+=(webkit2gtk-driver)
command -v xvfb-run >/dev/null || need_apt+=(xvfb)
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

if [ -n "$llama_install" ]; then
  echo "== pip install $llama_spec (waiting for its build)"
  if [ -n "$llama_pid" ] && ! wait "$llama_pid"; then
    cat "$wheels/build.log" >&2
    echo "== failed: building $llama_spec" >&2
    exit 1
  fi
  .venv/bin/pip uninstall --quiet -y llama-cpp-python >/dev/null 2>&1 || true  # one built with other flags
  quiet .venv/bin/pip install --find-links "$wheels" "$llama_spec"
  .venv/bin/python -c "import llama_cpp"
  echo "$llama_key" > .venv/llama-cpp-build
fi

echo "== npm ci (webruntime)"
(cd webruntime && quiet npm ci --no-audit --no-fund)

echo "== npm run build (webruntime -> webruntime/dist)"
(cd webruntime && quiet npm run build)
