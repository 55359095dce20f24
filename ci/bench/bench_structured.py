"""Benchmark (not a test): what grammar-constrained decoding costs, in both runtimes.

The same prompt is answered without a schema, with a plain JSON schema and with one using OpenAI's
strict-mode keywords Lantern writes its own grammar for (decimal and exclusive bounds, multipleOf, a
date, a pattern with a length, uniqueItems; free strings bounded by the default schema_defaults),
greedily, in the server's CPU engine and (with --browser) in the browser engine on WebGPU; printed
per engine: decode tokens/s in each case, the ratios to free text, and each grammar's first-use
compile time.

    .venv/bin/python ci/bench/bench_structured.py dist/smollm2 [--max-tokens 48] [--reps 3] [--browser]

With --jsonschemabench DIR it runs real-world schemas instead (ci/bench/jsonschemabench.py): Lantern's and
llguidance's declared coverage per split, the benchmark's test instances through each accepted grammar,
and with --answers N, N answers a split from the model, validated (with --browser, also from the
browser engine's wasm device):

    .venv/bin/python ci/bench/bench_structured.py dist/smollm2 --jsonschemabench ../shared/jsonschemabench \
        --answers 5 [--browser] [--twice]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "ci" / "bench"))

from browser import chromium, lantern_server  # noqa: E402

from lantern.server.engine import Generator, Stop  # noqa: E402
from lantern.server.protocol import ChatCompletionRequest  # noqa: E402
from lantern.server.structured import response_format_spec  # noqa: E402

MESSAGES = [{"role": "user", "content": "List four people with their name and age, as JSON."}]
SCHEMA = {
    "type": "array",
    "minItems": 4,
    "maxItems": 4,
    "items": {
        "type": "object",
        "required": ["name", "age"],
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    },
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "people", "schema": SCHEMA}}
# Keywords Lantern writes its own grammar for: decimal and exclusive bounds, multipleOf, formats, a pattern
# with a length, uniqueItems
STRICT = {
    "type": "array",
    "minItems": 4,
    "maxItems": 4,
    "items": {
        "type": "object",
        "required": ["name", "born", "height_m", "balance", "roles"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]+$", "maxLength": 12},
            "born": {"type": "string", "format": "date"},
            "height_m": {"type": "number", "exclusiveMinimum": 0.3, "maximum": 2.5, "multipleOf": 0.25},
            "balance": {"type": ["number", "null"], "minimum": -1000.5},
            "roles": {
                "type": "array",
                "items": {"enum": ["admin", "editor", "viewer"]},
                "uniqueItems": True,
                "minItems": 1,
                "maxItems": 2,
            },
        },
    },
}
STRICT_FORMAT = {"type": "json_schema", "json_schema": {"name": "people_strict", "schema": STRICT, "strict": True}}


def request(fmt: dict | None, max_tokens: int) -> dict:
    return {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, **({"response_format": fmt} if fmt else {})}


def cpu(path: Path, max_tokens: int, reps: int) -> dict:
    generator = Generator(path, "tvm")  # the CPU library, as the browser runs it
    prompt = generator.encode(generator.render_chat(MESSAGES))
    out = {}
    for label, fmt in (("free", None), ("schema", FORMAT), ("strict", STRICT_FORMAT)):
        grammar = None
        if fmt:
            start = time.perf_counter()
            defaults = ChatCompletionRequest(**request(fmt, max_tokens)).schema_defaults.model_dump()
            grammar = generator.compile_grammar(response_format_spec(fmt, defaults))
            out["compile_ms_" + label] = (time.perf_counter() - start) * 1000
        speeds = []
        for _ in range(reps):
            steps = []
            generator.generate(prompt, ChatCompletionRequest(**request(fmt, max_tokens)), Stop(), steps.append, grammar=grammar)
            speeds.append(steps[-1].usage.decode_tokens_per_s)
            out["tokens_" + label] = steps[-1].usage.completion_tokens
        out[label] = statistics.median(speeds)
    return out


def browser(path: Path, max_tokens: int, reps: int) -> dict:
    with lantern_server([path]) as (base, _), chromium() as b:
        page = b.new_page()
        page.goto(base + "/engine.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        page.evaluate("(m) => load(m)", f"/models/{path.name}/")
        out = {}
        for label, fmt in (("free", None), ("schema", FORMAT), ("strict", STRICT_FORMAT)):
            replies = page.evaluate("(reqs) => chat(reqs)", [request(fmt, max_tokens)] * reps)
            out[label] = statistics.median(r["usage"]["decode_tokens_per_s"] for r in replies)
            out["tokens_" + label] = replies[-1]["usage"]["completion_tokens"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="artifact folder built by `lantern build` (with a cpu library)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=3, help="runs per configuration (the median is printed)")
    parser.add_argument(
        "--browser",
        action="store_true",
        help="also run the browser engine (slow on SwiftShader); with --jsonschemabench and --answers: "
        "answer the same schemas on its wasm device",
    )
    parser.add_argument(
        "--jsonschemabench",
        type=Path,
        metavar="DIR",
        help="run JSONSchemaBench's schemas (<split>.jsonl, <split>.tests.jsonl) instead",
    )
    parser.add_argument(
        "--answers",
        type=int,
        default=0,
        metavar="N",
        help="with --jsonschemabench: answer N accepted schemas of each split with the model",
    )
    parser.add_argument(
        "--twice",
        action="store_true",
        help="with --jsonschemabench and --answers: ask every schema again at once (a prefix-cache hit) and count "
        "the second answers that differ from the first (on the server, and with --browser in the browser too)",
    )
    parser.add_argument("--splits", nargs="*", help="with --jsonschemabench: only these splits")
    parser.add_argument("--no-llguidance", action="store_true", help="with --jsonschemabench: skip llguidance")
    parser.add_argument("--dump", type=Path, help="with --jsonschemabench: write every schema's result as JSON lines")
    parser.add_argument(
        "--schema-defaults",
        type=json.loads,
        metavar="JSON",
        help="with --jsonschemabench: the requests' schema_defaults, e.g. '{\"maxLength\": 128}' (default: the server's)",
    )
    args = parser.parse_args()
    if args.jsonschemabench:
        import jsonschemabench

        return jsonschemabench.main(
            args.jsonschemabench,
            args.artifact,
            args.answers,
            args.max_tokens if args.max_tokens != 48 else 384,
            args.no_llguidance,
            args.splits,
            args.dump,
            args.schema_defaults,
            args.browser,
            args.twice,
        )
    rows = [("cpu (lantern serve)", cpu(args.artifact, args.max_tokens, args.reps))]
    if args.browser:
        rows.append(("browser (WebGPU)", browser(args.artifact, args.max_tokens, args.reps)))
    print(
        f"{'engine':22} {'free tok/s':>11} {'schema tok/s':>13} {'ratio':>6} {'strict tok/s':>13} {'ratio':>6}"
        "  tokens free/schema/strict"
    )
    for name, r in rows:
        print(
            f"{name:22} {r['free']:11.2f} {r['schema']:13.2f} {r['schema'] / r['free']:6.2f} {r['strict']:13.2f} "
            f"{r['strict'] / r['free']:6.2f}  {r['tokens_free']}/{r['tokens_schema']}/{r['tokens_strict']}"
        )
    print(
        f"grammar compile (first use, CPU engine): schema {rows[0][1]['compile_ms_schema']:.1f} ms, "
        f"strict (ranges, multipleOf, date, pattern, uniqueItems) {rows[0][1]['compile_ms_strict']:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
