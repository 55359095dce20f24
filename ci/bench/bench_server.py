"""Benchmark (not a test): `lantern serve` beside llama-cpp-python's own server, in one run.

Both serve the same artifact's GGUF on this machine's CPU behind the OpenAI API, with the same
thread count; `lantern serve --engine tvm` (the artifact's CPU library) is measured alongside as the
reference. Printed per server, greedy streamed chat requests:

* single stream: TTFT (request to first content chunk) and decode tokens/s (tokens after the first
  over the time after it), medians over --reps;
* 8 concurrent streams (different prompts): aggregate completion tokens/s over the wall time, and
  its ratio to one stream's tokens/s measured the same way;
* shared prefix: TTFT of a request whose first 512+ tokens (a system prompt) an earlier request
  already sent, with a different question, over the TTFT of that earlier request.

    pip install 'lantern-llm[llamacpp]' pydantic-settings sse-starlette starlette-context
    .venv/bin/python ci/bench/bench_server.py dist/smollm2 [--max-tokens 64] [--reps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lantern.gptq import DEFAULT_CALIBRATION

PROMPT = "Write a short paragraph about the history of {}."
CITIES = ["Paris", "Rome", "London", "Madrid", "Berlin", "Vienna", "Lisbon", "Prague"]


def stream_once(base: str, model: str, messages: list[dict], max_tokens: int) -> tuple[float, float, int, float]:
    """(TTFT s, decode tokens/s, tokens, total s) of one greedy streamed chat request."""
    body = json.dumps(
        {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
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
    end = time.perf_counter()
    tokens = usage_tokens or chunks  # llama.cpp's server sends one chunk per token
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    return first - start, decode, tokens, end - start


def user(city: str) -> list[dict]:
    return [{"role": "user", "content": PROMPT.format(city)}]


def measure(base: str, model: str, max_tokens: int, reps: int, prefix_text: str) -> dict:
    stream_once(base, model, user("Oslo"), 8)  # warm-up
    runs = [stream_once(base, model, user(CITIES[0]), max_tokens) for _ in range(reps)]
    out = {
        "ttft_s": statistics.median(r[0] for r in runs),
        "decode": statistics.median(r[1] for r in runs),
        "tokens": runs[-1][2],
        "single_tps": statistics.median(r[2] / r[3] for r in runs),
    }
    started = time.perf_counter()
    with ThreadPoolExecutor(len(CITIES)) as pool:
        many = list(pool.map(lambda c: stream_once(base, model, user(c), max_tokens), CITIES))
    out["aggregate_tps"] = sum(r[2] for r in many) / (time.perf_counter() - started)
    system = {"role": "system", "content": prefix_text}
    first = stream_once(base, model, [system, {"role": "user", "content": "Summarise this in one line."}], 8)
    second = stream_once(base, model, [system, {"role": "user", "content": "Name one word it uses."}], 8)
    out["prefix_first_s"], out["prefix_second_s"] = first[0], second[0]
    return out


def batch_ceiling(gguf: Path, vocab_size: int, threads: int, steps: int = 32) -> dict[int, float]:
    """llama.cpp alone, no server and no sampling: decode tokens/s with 1 and 8 sequences per
    llama_decode call, on the context the llamacpp engine makes. 8-seq over 1-seq is what batching
    can give at best on this machine."""
    from lantern.server.llamacpp import LlamaCppEngine

    dec = LlamaCppEngine(gguf, vocab_size=vocab_size, context_window=4096, threads=threads)
    lc, b, out = dec.lc, dec.batch, {}
    try:
        for n in (1, 8):
            lc.llama_memory_clear(dec.mem, True)
            for pos in range(-1, steps):  # pos -1: a 48-token prompt per sequence, not timed
                if pos == 0:
                    start = time.perf_counter()
                rows = [(s, p) for s in range(n) for p in (range(48) if pos < 0 else [48 + pos])]
                for i, (seq, p) in enumerate(rows):
                    b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = 100 + (p * 7 + seq) % 1000, p, 1, 1
                    b.seq_id[i][0] = seq
                b.n_tokens = len(rows)
                assert lc.llama_decode(dec.ctx, b) == 0
            out[n] = n * steps / (time.perf_counter() - start)
    finally:
        dec.close()
    return out


def layout_cost(gguf: Path, vocab_size: int, threads: int, reps: int = 3) -> dict[str, dict[str, float]]:
    """llama.cpp alone in the llamacpp engine's KV layout (a stream per slot, plain attention: the one
    whose logits repeat; the context LlamaCppEngine makes) and in the one it had before (one shared
    cache, flash attention): a 400-token prefill's tokens/s, and decode tokens/s with 1 and with 4
    sequences per call. Best of ``reps``."""
    from lantern.server.llamacpp import LlamaCppEngine

    dec = LlamaCppEngine(gguf, vocab_size=vocab_size, context_window=4096, threads=threads)
    lc, out = dec.lc, {}
    try:
        # before: the same model, one shared cache of 4,096 cells for 8 sequences, flash attention
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.kv_unified = 4096, 512, 512, 8, True
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        old = lc.llama_init_from_model(dec.model, cp)
        old_batch = lc.llama_batch_init(512, 0, 1)
        layouts = (("per-slot streams, plain attention", dec.ctx, dec.batch), ("shared cache, flash attention", old, old_batch))
        for name, ctx, b in layouts:
            mem = lc.llama_get_memory(ctx)
            best: dict[str, float] = {}
            for _ in range(reps):
                lc.llama_memory_clear(mem, True)
                start = time.perf_counter()
                _decode_rows(lc, ctx, b, [(0, p) for p in range(400)])
                got = {"prefill": 400 / (time.perf_counter() - start)}
                for n in (1, 4):
                    start = time.perf_counter()
                    for step in range(32):
                        _decode_rows(lc, ctx, b, [(0, 400 + step)] + [(s, step) for s in range(1, n)])
                    got[f"decode_{n}"] = 32 * n / (time.perf_counter() - start)
                    for s in range(1, n):
                        lc.llama_memory_seq_rm(mem, s, -1, -1)
                    lc.llama_memory_seq_rm(mem, 0, 400, -1)
                best = {k: max(v, best.get(k, 0.0)) for k, v in got.items()}
            out[name] = best
        lc.llama_batch_free(old_batch)
        lc.llama_free(old)
    finally:
        dec.close()
    return out


def _decode_rows(lc, ctx, b, rows: list[tuple[int, int]]) -> None:
    """One llama_decode of (sequence, position) rows, each with a token of its own and its logits."""
    for i, (seq, p) in enumerate(rows):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = 100 + (p * 7 + seq) % 1000, p, 1, 1
        b.seq_id[i][0] = seq
    b.n_tokens = len(rows)
    assert lc.llama_decode(ctx, b) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(name: str, command: list[str], port: int, ready_path: str):
    """Run a server in its own process (as users run it; the benchmark's clients stay out of its
    interpreter) and yield its base URL once ``ready_path`` answers 200."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(3000):
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(base + ready_path) as resp:
                    if resp.status == 200 and json.loads(resp.read()).get("status", "ok") == "ok":
                        break
            if proc.poll() is not None:
                raise SystemExit(f"{name} exited with {proc.returncode}: {' '.join(command)}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="artifact folder built by `lantern build` (with the gguf target)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads for both (default: all)")
    parser.add_argument("--layout-only", action="store_true", help="only the KV layout's cost (llama.cpp alone, seconds)")
    args = parser.parse_args()
    manifest = json.loads((args.artifact / "lantern.json").read_text())
    if not (manifest.get("gguf") or {}).get("files"):
        raise SystemExit(f"{args.artifact} has no GGUF: build it with --targets webgpu,cpu,gguf")
    gguf = args.artifact / manifest["gguf"]["files"][0]
    layouts = layout_cost(gguf, manifest["model"]["vocab_size"], args.threads)
    (ours_layout, theirs), (old_layout, before) = layouts.items()
    print(f"llama.cpp alone, {args.threads} threads: {ours_layout} (the engine's) against {old_layout} (before)")
    for key, what in (("prefill", "400-token prefill"), ("decode_1", "decode, 1 sequence"), ("decode_4", "decode, 4 sequences")):
        print(f"  {what:20} {theirs[key]:7.1f} tok/s against {before[key]:7.1f}: {theirs[key] / before[key]:.2f}x")
    if args.layout_only:
        return 0
    prefix_text = DEFAULT_CALIBRATION.read_text()[:2600]  # ~600 tokens of English prose
    rows = []
    lantern = str(Path(sys.executable).with_name("lantern"))
    for engine in ("llamacpp", "tvm"):
        port = free_port()
        with server(
            "lantern serve",
            [lantern, "serve", str(args.artifact), "--port", str(port), "--engine", engine, "--threads", str(args.threads)],
            port,
            "/health",
        ) as base:
            rows.append(
                (f"lantern serve --engine {engine}", measure(base, args.artifact.name, args.max_tokens, args.reps, prefix_text))
            )
    port = free_port()
    with server(
        "llama_cpp.server (is llama-cpp-python[server] installed?)",
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--port",
            str(port),
            "--n_ctx",
            "4096",
            "--n_threads",
            str(args.threads),
            "--n_threads_batch",
            str(args.threads),
        ],
        port,
        "/v1/models",
    ) as base:
        rows.append(("llama-cpp-python server (same GGUF)", measure(base, "model", args.max_tokens, args.reps, prefix_text)))
    print(
        f"{manifest['model']['name']} {manifest['gguf']['tensor_type']}, {args.threads} threads, "
        f"{args.max_tokens} greedy tokens, medians of {args.reps}"
    )
    print(
        f"{'server':38} {'TTFT s':>7} {'decode':>7} {'1 stream':>9} {'8 streams':>10} {'8/1':>5} "
        f"{'prefix TTFT 1st':>16} {'2nd':>6} {'2nd/1st':>8}"
    )
    for name, r in rows:
        print(
            f"{name:38} {r['ttft_s']:7.2f} {r['decode']:7.1f} {r['single_tps']:9.1f} {r['aggregate_tps']:10.1f} "
            f"{r['aggregate_tps'] / r['single_tps']:5.2f} {r['prefix_first_s']:16.3f} {r['prefix_second_s']:6.3f} "
            f"{r['prefix_second_s'] / r['prefix_first_s']:8.2f}"
        )
    ours, peer = rows[0][1], rows[2][1]
    ceiling = batch_ceiling(gguf, manifest["model"]["vocab_size"], args.threads)
    print(
        f"llama.cpp alone (llama_decode, no server): 1 sequence {ceiling[1]:.1f} tok/s, 8 sequences per call "
        f"{ceiling[8]:.1f} tok/s: batching can give at most {ceiling[8] / ceiling[1]:.2f}x here"
    )
    print(
        f"lantern llamacpp / llama-cpp-python: single-stream decode {ours['decode'] / peer['decode']:.2f}x "
        f"(bar 0.9x); 8 streams {ours['aggregate_tps'] / ours['single_tps']:.2f}x one stream (bar 2x; "
        f"{ours['aggregate_tps'] / ours['single_tps'] / (ceiling[8] / ceiling[1]):.2f} of the ceiling); "
        f"shared-prefix TTFT {ours['prefix_second_s'] / ours['prefix_first_s']:.2f}x the first (bar 0.2x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
