"""Benchmark (not a test): what grammar-constrained decoding costs, in both engines.

The same prompt is answered with and without a JSON schema, greedily, in the server's CPU engine
and (with --browser) in the browser engine on WebGPU; printed per engine: decode tokens/s with and
without the schema, their ratio, and the grammar's first-use compile time.

    .venv/bin/python ci/bench_structured.py dist/smollm2 [--max-tokens 48] [--reps 3] [--browser]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import chromium, lantern_server  # noqa: E402

from lantern.server.engine import ModelEngine  # noqa: E402
from lantern.server.protocol import ChatCompletionRequest  # noqa: E402
from lantern.server.structured import response_format_spec  # noqa: E402

MESSAGES = [{"role": "user", "content": "List four people with their name and age, as JSON."}]
SCHEMA = {"type": "array", "minItems": 4, "maxItems": 4, "items": {
    "type": "object", "required": ["name", "age"],
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 99}}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "people", "schema": SCHEMA}}


def request(constrained: bool, max_tokens: int) -> dict:
    return {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0,
            **({"response_format": FORMAT} if constrained else {})}


def cpu(path: Path, max_tokens: int, reps: int) -> dict:
    engine = ModelEngine(path, "tvm")  # the CPU library, as the browser runs it
    prompt = engine.encode(engine.render_chat(MESSAGES))
    start = time.perf_counter()
    grammar = engine.compile_grammar(response_format_spec(FORMAT))
    compile_ms = (time.perf_counter() - start) * 1000
    out = {"compile_ms": compile_ms}
    for constrained in (False, True):
        speeds = []
        for _ in range(reps):
            steps = []
            engine.generate(prompt, ChatCompletionRequest(**request(constrained, max_tokens)), threading.Event(),
                            steps.append, grammar=grammar if constrained else None)
            speeds.append(steps[-1].usage.decode_tokens_per_s)
            out["tokens_" + ("schema" if constrained else "free")] = steps[-1].usage.completion_tokens
        out["schema" if constrained else "free"] = statistics.median(speeds)
    return out


def browser(path: Path, max_tokens: int, reps: int) -> dict:
    with lantern_server([path]) as (base, _), chromium() as b:
        page = b.new_page()
        page.goto(base + "/engine.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        page.evaluate("(m) => load(m)", f"/models/{path.name}/")
        out = {}
        for constrained in (False, True):
            replies = page.evaluate("(reqs) => chat(reqs)", [request(constrained, max_tokens)] * reps)
            out["schema" if constrained else "free"] = statistics.median(
                r["usage"]["decode_tokens_per_s"] for r in replies)
            out["tokens_" + ("schema" if constrained else "free")] = replies[-1]["usage"]["completion_tokens"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="artifact folder built by `lantern build` (with a cpu library)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=3, help="runs per configuration (the median is printed)")
    parser.add_argument("--browser", action="store_true", help="also run the browser engine (slow on SwiftShader)")
    args = parser.parse_args()
    rows = [("cpu (lantern serve)", cpu(args.artifact, args.max_tokens, args.reps))]
    if args.browser:
        rows.append(("browser (WebGPU)", browser(args.artifact, args.max_tokens, args.reps)))
    print(f"{'engine':22} {'free tok/s':>11} {'schema tok/s':>13} {'ratio':>6}  tokens free/schema")
    for name, r in rows:
        print(f"{name:22} {r['free']:11.2f} {r['schema']:13.2f} {r['schema'] / r['free']:6.2f}  "
              f"{r['tokens_free']}/{r['tokens_schema']}")
    print(f"grammar compile (first use, CPU engine): {rows[0][1]['compile_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
