"""Benchmark (not a test): a built artifact on WebGPU in headless Chromium, through WebLLM's engine.

Prints the wall time of the whole run (browser start to answer), TTFT, prefill and decode tokens/s, and the weight bandwidth decode achieves
(decode tokens/s x weight bytes), to compare against the adapter's matvec bandwidth; on
SwiftShader that is 2-3.3 GB/s on one core (see shared/PLATFORM.md).

    .venv/bin/python ci/bench_webgpu.py dist/smollm2 [--prompt-words 100] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import webllm_chat  # noqa: E402

from lantern.artifact import Artifact  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", help="artifact folder built by `lantern build`")
    parser.add_argument("--prompt-words", type=int, default=100, help="length of the prompt in words")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate")
    args = parser.parse_args()

    art = Artifact.open(args.artifact)
    prompt = "Summarise this text: " + " ".join(["the quick brown fox jumps over the lazy dog"] * 20)
    prompt = " ".join(prompt.split()[: args.prompt_words])
    start = time.perf_counter()
    reply = webllm_chat(art, [{"role": "user", "content": prompt}], args.max_tokens)
    total = time.perf_counter() - start
    usage = reply["usage"]
    extra = usage.get("extra", {})
    weight_bytes = art.manifest["weights"]["bytes"]
    decode = extra.get("decode_tokens_per_s", 0.0)
    figures = {
        "model": f"{art.manifest['model']['name']} {art.manifest['quantization']}",
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "browser_load_and_answer_s": round(total, 2),  # browser start, weights, compile, answer
        "ttft_s": round(extra.get("time_to_first_token_s", 0.0), 3),
        "prefill_tokens_per_s": round(extra.get("prefill_tokens_per_s", 0.0), 2),
        "decode_tokens_per_s": round(decode, 2),
        "decode_weight_bandwidth_GB_s": round(decode * weight_bytes / 1e9, 2),
    }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
