"""Benchmark (not a test): an artifact on WebGPU in headless Chromium, beside its peers and a roofline.

All in one run, on the same machine, the same prompt and greedy decoding:

- lantern  Lantern's runtime in its Web Worker, on the library it picks for this adapter;
- webllm   the unmodified WebLLM engine on the same artifact and library;
- wllama   llama.cpp in wasm (npm @wllama/wllama) on the CPU, on the bundled SmolLM2 GGUF (or --gguf),
           1 thread, and 2 threads in a cross-origin-isolated page;
- roofline plain WGSL kernels written independently of Lantern (tests/web/roofline.html): a q4 GEMV of
           each of the model's matrices (one dispatch each; their sum over one token is the "ideal
           decode" rate) and an f32 register-tiled matmul (GFLOP/s).

It prints decode as a share of the ideal decode rate, prefill GFLOP/s (2 x non-embedding parameters per
prompt token, plus the head once) as a share of the matmul's, and both as ratios to wllama.
``--profile`` adds where the GPU time goes per kernel (timestamp queries), for prefill and decode.

    .venv/bin/python ci/bench/bench_webgpu.py dist/smollm2 [--prompt-words 100] [--max-tokens 64]
        [--engines lantern,webllm,wllama] [--profile] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from browser import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    WLLAMA,
    chromium,
    lantern_server,
    serve,
    token_matrices,
    webllm_chat,
)

from lantern.runtime.artifact import Artifact  # noqa: E402

WEB = ROOT / "tests" / "web"
PROFILE_ARGS = ["--disable-dawn-features=timestamp_quantization"]


def bench_parser(
    doc: str, artifact_help: str = "artifact folder built by `lantern build` (with the gguf target)"
) -> argparse.ArgumentParser:
    """A browser benchmark's command line so far: its docstring as the help, the artifact folder."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", help=artifact_help)
    return parser


def add_prompt_options(parser: argparse.ArgumentParser) -> None:
    """--prompt-words and --max-tokens: the prompt's length and the tokens to generate, alike in each benchmark."""
    parser.add_argument("--prompt-words", type=int, default=100, help="length of the prompt in words")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate")


def prompt_messages(words: int) -> list[dict]:
    text = "Summarise this text: " + " ".join(["the quick brown fox jumps over the lazy dog"] * 40)
    return [{"role": "user", "content": " ".join(text.split()[:words])}]


# ---- engines ---------------------------------------------------------------------------------------


def lantern_run(art: Artifact, messages: list[dict], max_tokens: int) -> dict:
    with lantern_server([art.path]) as (base, _), chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/engine.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        start = time.perf_counter()
        stats = page.evaluate("(m) => load(m)", f"/models/{art.path.name}/")
        load_s = time.perf_counter() - start
        [reply] = page.evaluate("(reqs) => chat(reqs)", [{"messages": messages, "max_tokens": max_tokens, "temperature": 0}])
    u = reply["usage"]
    return {
        "library": stats["library"],
        "load_s": load_s,
        "prompt_tokens": u["prompt_tokens"],
        "completion_tokens": u["completion_tokens"],
        "ttft_s": u["ttft_ms"] / 1000,
        "prefill_tokens_per_s": u["prefill_tokens_per_s"],
        "decode_tokens_per_s": u["decode_tokens_per_s"],
    }


def webllm_run(art: Artifact, messages: list[dict], max_tokens: int) -> dict:
    start = time.perf_counter()
    reply = webllm_chat(art, messages, max_tokens)
    total = time.perf_counter() - start
    u, extra = reply["usage"], reply["usage"].get("extra", {})
    return {
        "library": art.library("webgpu", emulated=True).name,
        "load_and_answer_s": total,
        "prompt_tokens": u["prompt_tokens"],
        "completion_tokens": u["completion_tokens"],
        "ttft_s": extra.get("time_to_first_token_s", 0.0),
        "prefill_tokens_per_s": extra.get("prefill_tokens_per_s", 0.0),
        "decode_tokens_per_s": extra.get("decode_tokens_per_s", 0.0),
    }


def wllama_run(gguf: Path, messages: list[dict], max_tokens: int, threads: int) -> dict:
    routes = {"/wllama/": WLLAMA, "/page/": WEB, "/gguf/": gguf.parent}
    with serve(routes, isolated=True) as base, chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/page/wllama_chat.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        out = page.evaluate(
            "([u, m, n, t]) => wllamaChat(u, m, n, t)", [f"{base}/gguf/{gguf.name}", messages, max_tokens, threads]
        )
    t = out["reply"]["timings"]
    if threads > 1 and not out["cross_origin_isolated"]:
        raise RuntimeError("the wllama page is not cross-origin isolated: it would run one thread")
    return {
        "library": f"{gguf.name} ({threads} thread{'s' if threads > 1 else ''})",
        "load_s": out["load_s"],
        "prompt_tokens": t["prompt_n"],
        "completion_tokens": t["predicted_n"],
        "ttft_s": t["prompt_ms"] / 1000,
        "prefill_tokens_per_s": t["prompt_per_second"],
        "decode_tokens_per_s": t["predicted_per_second"],
    }


# ---- roofline and profile ----------------------------------------------------------------------------


def roofline(art: Artifact, prompt_tokens: int) -> dict:
    matrices = token_matrices(art)
    widest = max(matrices, key=lambda m: m[0] * m[1] if m[0] < 20000 else 0)  # the largest layer matrix
    m = max(4, prompt_tokens // 4 * 4)
    with serve({"/page/": WEB}) as base, chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/page/roofline.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        return page.evaluate("([mats, mm]) => roofline(mats, mm)", [matrices, [m, widest[0], widest[1]]])


def profile(art: Artifact, messages: list[dict], max_tokens: int) -> dict:
    """Per-kernel GPU milliseconds of one prefill and of the decode steps after it."""
    from playwright.sync_api import sync_playwright

    script = (WEB / "gpu_profile.js").read_text()
    with lantern_server([art.path]) as (base, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS + PROFILE_ARGS)
        page = browser.new_page()
        page.add_init_script(script)
        page.goto(base + "/engine.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        page.evaluate("(m) => load(m, {worker: false})", f"/models/{art.path.name}/")  # profiled in the page
        page.evaluate("() => window.__lanternProfile.take()")
        page.evaluate("(r) => chat([r])", {"messages": messages, "max_tokens": 1, "temperature": 0})
        prefill = page.evaluate("() => window.__lanternProfile.take()")
        [reply] = page.evaluate(
            "(r) => chat([r])",
            {
                "messages": messages + [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Go on."}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        )
        decode = page.evaluate("() => window.__lanternProfile.take()")
        browser.close()
    return {"prefill": prefill, "decode": decode, "decode_tokens": reply["usage"]["completion_tokens"]}


def print_profile(prof: dict) -> None:
    for phase in ("prefill", "decode"):
        kernels = prof[phase]
        total = sum(k["ms"] for k in kernels.values())
        print(f"\nGPU time, {phase} ({total:.0f} ms in {sum(k['count'] for k in kernels.values())} dispatches):")
        for name, k in sorted(kernels.items(), key=lambda kv: -kv[1]["ms"])[:14]:
            print(f"  {k['ms']:9.1f} ms {100 * k['ms'] / total:5.1f}%  {k['count']:6d}x  {name}")


# ---- report ------------------------------------------------------------------------------------------


def flops(art: Artifact) -> tuple[float, float]:
    """(FLOPs per prompt token, FLOPs of the head once): 2 x multiply-adds."""
    cfg = json.loads((art.path / "mlc-chat-config.json").read_text())["model_config"]
    head = cfg["vocab_size"] * cfg["hidden_size"]
    body = art.manifest["model"]["parameters"] - head * (1 if cfg["tie_word_embeddings"] else 2)
    return 2.0 * body, 2.0 * head


def main() -> int:
    parser = bench_parser(__doc__, "artifact folder built by `lantern build`")
    add_prompt_options(parser)
    parser.add_argument("--engines", default="lantern,webllm,wllama", help="comma-separated: lantern, webllm, wllama")
    parser.add_argument("--gguf", help="GGUF for wllama (default: the bundled SmolLM2 Q4_1)")
    parser.add_argument("--profile", action="store_true", help="also print GPU time per kernel")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()

    art = Artifact.open(args.artifact)
    messages = prompt_messages(args.prompt_words)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    results: dict[str, dict] = {}
    for name in engines:
        print(f"running {name}...", file=sys.stderr, flush=True)
        if name == "wllama":
            from lantern.importer import bundled_path
            from lantern.pipeline import default_cache_dir

            gguf = Path(args.gguf) if args.gguf else bundled_path("smollm2", default_cache_dir())
            results["wllama-1t"] = wllama_run(gguf, messages, args.max_tokens, 1)
            results["wllama-2t"] = wllama_run(gguf, messages, args.max_tokens, 2)
        else:
            results[name] = {"lantern": lantern_run, "webllm": webllm_run}[name](art, messages, args.max_tokens)
    prompt_tokens = next((r["prompt_tokens"] for r in results.values()), 128)
    print("running the roofline kernels...", file=sys.stderr, flush=True)
    roof = roofline(art, prompt_tokens)
    per_token, head = flops(art)
    for r in results.values():
        if r["prefill_tokens_per_s"]:
            n = r["prompt_tokens"]
            r["prefill_GFLOP_s"] = (per_token * n + head) / (n / r["prefill_tokens_per_s"]) / 1e9
    report = {
        "model": f"{art.manifest['model']['name']} {art.manifest['quantization']}",
        "adapter_roofline": roof,
        "results": results,
    }

    print(f"\n{report['model']}, {prompt_tokens}-token prompt, {args.max_tokens} greedy tokens, {os.cpu_count()} CPU cores")
    print(f"{'engine':<12}{'library':<44}{'load s':>8}{'TTFT s':>8}{'prefill t/s':>12}{'decode t/s':>11}")
    for name, r in results.items():
        load = r.get("load_s") or r.get("load_and_answer_s") or 0
        print(
            f"{name:<12}{r['library']:<44}{load:>8.1f}{r['ttft_s']:>8.1f}{r['prefill_tokens_per_s']:>12.2f}"
            f"{r['decode_tokens_per_s']:>11.2f}"
        )
    print(
        f"\nroofline (plain WGSL on this adapter): q4 GEMV {roof['gemv_GB_s']:.2f} GB/s -> ideal decode "
        f"{roof['ideal_decode_tokens_per_s']:.2f} tokens/s; f32 matmul {roof['matmul']['GFLOP_s']:.2f} GFLOP/s"
    )
    if "lantern" in results:
        lan = results["lantern"]
        ratios = {
            "decode / ideal decode": lan["decode_tokens_per_s"] / roof["ideal_decode_tokens_per_s"],
            "prefill GFLOP/s / matmul GFLOP/s": lan.get("prefill_GFLOP_s", 0) / roof["matmul"]["GFLOP_s"],
        }
        for peer in ("wllama-1t", "wllama-2t", "webllm"):
            if peer in results and results[peer]["decode_tokens_per_s"]:
                ratios[f"decode / {peer}"] = lan["decode_tokens_per_s"] / results[peer]["decode_tokens_per_s"]
                ratios[f"prefill / {peer}"] = lan["prefill_tokens_per_s"] / results[peer]["prefill_tokens_per_s"]
        report["ratios"] = ratios
        print("\nlantern:")
        for key, value in ratios.items():
            print(f"  {key:<36}{value:6.2f}x")
    if args.profile:
        report["profile"] = profile(art, messages, min(args.max_tokens, 16))
        print_profile(report["profile"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
