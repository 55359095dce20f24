"""Benchmark (not a test): an artifact on WebGPU in headless Chromium, Lantern's runtime beside WebLLM.

Both engines load the same artifact folder and answer the same prompt greedily. Printed per
engine: load time (cold: empty cache), TTFT, prefill and decode tokens/s, and the weight
bandwidth decode achieves (decode tokens/s x weight bytes), to compare against the adapter's
matvec bandwidth; on SwiftShader that is 2-3.3 GB/s on one core (see shared/PLATFORM.md).

    .venv/bin/python ci/bench_webgpu.py dist/smollm2 [--prompt-words 100] [--max-tokens 64] [--engines lantern,webllm]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import chromium, lantern_server, webllm_chat  # noqa: E402

from lantern.artifact import Artifact  # noqa: E402


def lantern_run(art: Artifact, messages: list[dict], max_tokens: int) -> dict:
    with lantern_server([art.path]) as (base, _), chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/engine.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        start = time.perf_counter()
        stats = page.evaluate("(m) => load(m)", f"/models/{art.path.name}/")
        load_s = time.perf_counter() - start
        [reply] = page.evaluate("(reqs) => chat(reqs)", [{"messages": messages, "max_tokens": max_tokens,
                                                          "temperature": 0}])
    u = reply["usage"]
    return {"library": stats["library"], "load_s": load_s, "prompt_tokens": u["prompt_tokens"],
            "completion_tokens": u["completion_tokens"], "ttft_s": u["ttft_ms"] / 1000,
            "prefill_tokens_per_s": u["prefill_tokens_per_s"], "decode_tokens_per_s": u["decode_tokens_per_s"]}


def webllm_run(art: Artifact, messages: list[dict], max_tokens: int) -> dict:
    start = time.perf_counter()
    reply = webllm_chat(art, messages, max_tokens)
    total = time.perf_counter() - start
    u, extra = reply["usage"], reply["usage"].get("extra", {})
    return {"library": art.library("webgpu").name,
            "load_s": None,  # WebLLM's load is inside its single call; see load_and_answer_s
            "load_and_answer_s": total, "prompt_tokens": u["prompt_tokens"],
            "completion_tokens": u["completion_tokens"], "ttft_s": extra.get("time_to_first_token_s", 0.0),
            "prefill_tokens_per_s": extra.get("prefill_tokens_per_s", 0.0),
            "decode_tokens_per_s": extra.get("decode_tokens_per_s", 0.0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", help="artifact folder built by `lantern build`")
    parser.add_argument("--prompt-words", type=int, default=100, help="length of the prompt in words")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate")
    parser.add_argument("--engines", default="lantern,webllm", help="comma-separated: lantern, webllm")
    args = parser.parse_args()

    art = Artifact.open(args.artifact)
    prompt = "Summarise this text: " + " ".join(["the quick brown fox jumps over the lazy dog"] * 20)
    messages = [{"role": "user", "content": " ".join(prompt.split()[: args.prompt_words])}]
    runners = {"lantern": lantern_run, "webllm": webllm_run}
    weight_bytes = art.manifest["weights"]["bytes"]
    results = {}
    for name in args.engines.split(","):
        r = runners[name.strip()](art, messages, args.max_tokens)
        r["decode_weight_bandwidth_GB_s"] = r["decode_tokens_per_s"] * weight_bytes / 1e9
        results[name] = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
    print(json.dumps({"model": f"{art.manifest['model']['name']} {art.manifest['quantization']}",
                      "results": results}, indent=2))
    if "lantern" in results and "webllm" in results and results["webllm"]["decode_tokens_per_s"]:
        ratio = results["lantern"]["decode_tokens_per_s"] / results["webllm"]["decode_tokens_per_s"]
        print(f"decode tokens/s, lantern / webllm: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
