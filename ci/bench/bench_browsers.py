"""Benchmark (not a test): the `wasm` device in each browser engine, with Chromium as the yardstick.

All in one run, on this machine, headless, the same artifact (its GGUF), the same prompts and greedy
decoding, at the same thread count in every engine:

- chromium  llama.cpp's default build (memory64, wasm exceptions, JSPI);
- firefox   Firefox ESR, the default build;
- webkit    WebKitGTK (JavaScriptCore, Safari's engine), the compat build (it has no memory64).

For each: cold load (nothing cached), cached load (a new engine in the same page, files from the Cache
API), TTFT, prefill and decode tokens/s (medians of --repeat prompts that differ in their first words),
and decode as a ratio of Chromium's default build. The bar (issue 47): Firefox at least 0.8x on the
default build, WebKit at least 0.5x on the compat build.

    .venv/bin/python ci/bench/bench_browsers.py dist/smollm2 [--threads 2] [--prompt-words 100] [--max-tokens 64] [--repeat 3]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "ci" / "bench"))

from bench_cpu import variants  # noqa: E402
from bench_webgpu import add_prompt_options, bench_parser, prompt_messages  # noqa: E402
from browser import lantern_server  # noqa: E402

from lantern.browsers import missing, open_browser  # noqa: E402

ENGINES = ("chromium", "firefox", "webkit")
GOALS = {"firefox": 0.8, "webkit": 0.5}


def run(engine: str, base: str, model: str, prompts: list[list[dict]], max_tokens: int, threads: int) -> dict:
    options = {"device": "wasm", "threads": threads}
    with open_browser(engine, webgpu=False) as browser:
        page = browser.new_page()
        page.goto(base + "/engine.html")
        page.wait_for("document.getElementById('status').textContent === 'ready'")
        page.evaluate("async () => { await caches.delete('lantern-artifacts-v1'); }")
        start = time.perf_counter()
        page.evaluate("([m, o]) => load(m, o)", [model, options])
        cold = time.perf_counter() - start
        page.evaluate("() => engine.unload()")
        start = time.perf_counter()
        stats = page.evaluate("([m, o]) => load(m, o)", [model, options])
        cached = time.perf_counter() - start
        replies = page.evaluate(
            "(reqs) => chat(reqs)", [{"messages": m, "max_tokens": max_tokens, "temperature": 0} for m in prompts]
        )
        page.evaluate("() => engine.unload()")
    us = [r["usage"] for r in replies]
    return {
        "engine": engine,
        "build": stats["wasm"]["build"],
        "label": stats["deviceLabel"],
        "cold_load_s": cold,
        "cached_load_s": cached,
        "prompt_tokens": us[0]["prompt_tokens"],
        "completion_tokens": us[0]["completion_tokens"],
        "ttft_s": statistics.median(u["ttft_ms"] / 1000 for u in us),
        "prefill_tokens_per_s": statistics.median(u["prefill_tokens_per_s"] for u in us),
        "decode_tokens_per_s": statistics.median(u["decode_tokens_per_s"] for u in us),
        "text": replies[0]["choices"][0]["message"]["content"],
    }


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads in every engine (default 2)")
    add_prompt_options(parser)
    parser.add_argument("--repeat", type=int, default=3, help="prompts per engine (medians are printed)")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()
    art = Path(args.artifact)
    prompts = variants(prompt_messages(args.prompt_words), args.repeat)
    results = []
    with lantern_server([art]) as (base, _):
        for engine in ENGINES:
            why = missing(engine)
            if why:
                print(f"{engine}: skipped ({why})", file=sys.stderr)
                continue
            print(f"{engine} ...", file=sys.stderr, flush=True)
            results.append(run(engine, base, f"/models/{art.name}/", prompts, args.max_tokens, args.threads))
    yardstick = next(r for r in results if r["engine"] == "chromium")
    print(
        f"{'engine':<9} {'build':<8} {'cold s':>7} {'cached s':>9} {'TTFT s':>7} {'prefill/s':>10} "
        f"{'decode/s':>9} {'decode vs chromium':>19}  same text"
    )
    for r in results:
        ratio = r["decode_tokens_per_s"] / yardstick["decode_tokens_per_s"]
        goal = GOALS.get(r["engine"])
        bar = f" (goal {goal}x: {'met' if ratio >= goal else 'MISSED'})" if goal else ""
        print(
            f"{r['engine']:<9} {r['build']:<8} {r['cold_load_s']:>7.1f} {r['cached_load_s']:>9.1f} "
            f"{r['ttft_s']:>7.2f} {r['prefill_tokens_per_s']:>10.1f} {r['decode_tokens_per_s']:>9.1f} "
            f"{ratio:>18.2f}x  {r['text'] == yardstick['text']}{bar}"
        )
    print(
        f"({args.threads} threads, prompt {yardstick['prompt_tokens']} tokens, {args.max_tokens} generated, "
        f"medians of {args.repeat})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
