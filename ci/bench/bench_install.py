"""Benchmark (not a test): what `pip install` of the wheel costs, and what the light install's grammar
engine (xgrammar's wasm build, server/xgrammar_wasm.py) costs against the native one.

``install``: builds the wheel of a checkout (default: this one), installs it with ``--extras`` into a
fresh venv from the registry, and prints the venv's size, the install's time, the time from
`lantern serve ARTIFACT --engine llamacpp` to /health, and the first and second answers to one JSON
schema (the first includes loading the grammar engine and compiling). Run it on two checkouts (before
and after a change) in one session; pip's wheel cache and the llama-cpp-python wheel of ci/setup.sh
(``--find-links``) are used alike by both.

``grammars``: both xgrammar builds in this process on one model's vocabulary: compile time of the first
``--schemas`` accepted JSONSchemaBench schemas (spread over the splits) and mask time along two
instances of each; prints p50/p99 and the ratio, and checks that every mask is the same.

    .venv/bin/python ci/bench/bench_install.py install ARTIFACT [--checkout DIR] [--extras llamacpp]
    .venv/bin/python ci/bench/bench_install.py grammars ARTIFACT [--schemas 40]
    .venv/bin/python ci/bench/bench_install.py core ARTIFACT [--schemas 40]

``core``: the native core as `lantern serve` loads it without torch (server/xgrammar_core.py) against the
xgrammar package's own compiler, on the same grammars: compile p50/p99 and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci" / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from test_wheel import wait_healthy  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}


def folder_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_symlink())


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())


def install(artifact: Path, checkout: Path, extras: str, find_links: str | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="lantern-install-"))
    try:
        build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(work / "dist"), str(checkout)]
        subprocess.run(build, check=True)
        wheel = next((work / "dist").glob("lantern_llm-*.whl"))
        subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True)
        pip = [str(work / "venv" / "bin" / "pip"), "install", *(["--find-links", find_links] if find_links else [])]
        start = time.perf_counter()
        out = subprocess.run([*pip, f"{wheel}[{extras}]"], check=True, capture_output=True, text=True).stdout
        installed = time.perf_counter() - start
        size = folder_bytes(work / "venv")
        # pip installs in dependency order, the wheel itself last: an install stopped in this phase leaves
        # the dependencies in place without lantern
        order = next(
            (line.split(":", 1)[1].split(", ") for line in out.splitlines() if line.startswith("Installing collected")), []
        )
        heavy = [name for name in order if name.strip().lower() in ("torch", "triton", "xgrammar")]
        print(
            f"{checkout} [{extras}]: venv {size / 1e9:.2f} GB, install {installed:.0f} s, {len(order)} packages "
            f"(last: {order[-1].strip() if order else '?'}), with {', '.join(heavy) or 'no torch, triton or xgrammar'}"
        )

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "LANTERN_XGRAMMAR")}
        start = time.perf_counter()
        server = subprocess.Popen(
            [str(work / "venv" / "bin" / "lantern"), "serve", str(artifact), "--port", str(port), "--engine", "llamacpp"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=work,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(server, base)
            healthy = time.perf_counter() - start
            body = {
                "model": artifact.name,
                "messages": [{"role": "user", "content": "The capital of France and its population, as JSON."}],
                "max_tokens": 40,
                "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
            }
            times, texts = [], []
            for _ in range(2):
                start = time.perf_counter()
                texts.append(post(f"{base}/v1/chat/completions", body)["choices"][0]["message"]["content"])
                times.append(time.perf_counter() - start)
        finally:
            server.terminate()
            server.wait(timeout=30)
        print(f"  serve: /health after {healthy:.1f} s; first JSON answer {times[0]:.2f} s, second {times[1]:.2f} s: {texts[0]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def grammars(artifact: Path, schemas: int) -> None:
    import jsonschemabench as jb

    from lantern.server.engine import Generator
    from lantern.server.grammars import GrammarCompiler
    from lantern.server.protocol import ChatCompletionRequest
    from lantern.server.structured import StructuredOutputError, response_format_spec

    # the vocabulary, stop tokens and token post-processing as lantern serve reads them (the tvm engine: the
    # lightest to load)
    generator = Generator(artifact, "tvm")
    tokenizer, vocab_size = generator.tokenizer, generator.vocab_size
    tokenizer_json = json.loads((artifact / "tokenizer.json").read_text())
    made, init = {}, {}
    for build in ("native", "wasm"):
        start = time.perf_counter()
        made[build] = GrammarCompiler(
            tokenizer_json, generator.token_postproc, vocab_size, sorted(generator.stop_ids), build=build
        )
        init[build] = time.perf_counter() - start
    rows = jb.load(ROOT.parent / "shared" / "jsonschemabench")
    rows = rows[:: max(1, len(rows) // schemas)][:schemas]
    compile_s: dict[str, list[float]] = {"native": [], "wasm": []}
    mask_s: dict[str, list[float]] = {"native": [], "wasm": []}
    steps = differ = 0
    for row in rows:
        try:
            req = ChatCompletionRequest(**jb.request_for(row["schema"]))
            spec = response_format_spec(req.response_format.model_dump(exclude_none=True), req.schema_defaults.model_dump())
            compiled = {}
            for build, compiler in made.items():
                start = time.perf_counter()
                compiled[build] = compiler.compile(spec)
                compile_s[build].append(time.perf_counter() - start)
        except StructuredOutputError:
            continue
        for test in row["tests"][:2]:
            answer = json.dumps(jb.in_schema_order(test["data"], row["schema"], row["schema"]), **jb.LAYOUT)
            masks = {build: made[build].matcher(compiled[build]) for build in made}
            for token in tokenizer.encode(answer, add_special_tokens=False).ids:
                allowed = {}
                for build, mask in masks.items():
                    start = time.perf_counter()
                    allowed[build] = mask.allowed()
                    mask_s[build].append(time.perf_counter() - start)
                steps += 1
                differ += not np.array_equal(allowed["native"], allowed["wasm"])
                if not allowed["native"][token]:
                    break
                for mask in masks.values():
                    mask.accept(token)

    def q(values: list[float]) -> str:
        return f"p50 {statistics.median(values) * 1000:.1f} ms, p99 {np.percentile(values, 99) * 1000:.1f} ms"

    done = len(compile_s["native"])
    print(f"{artifact.name}: vocabulary {vocab_size}, {done} schemas, {steps} mask steps, {differ} masks differ")
    print(f"  compiler made: native {init['native']:.2f} s, wasm {init['wasm']:.2f} s")
    for what, values in (("compile", compile_s), ("mask", mask_s)):
        ratio = statistics.median(values["wasm"]) / statistics.median(values["native"])
        print(f"  {what}: native {q(values['native'])}; wasm {q(values['wasm'])}; wasm/native at p50 {ratio:.1f}x")
    generator.close()


def core(artifact: Path, schemas: int) -> None:
    """Compile time of the native core as lantern serve loads it (server/xgrammar_core.py, without torch)
    against the xgrammar package's own GrammarCompiler (what the server called before), on the same
    grammars: each schema three times per side, alternating which goes first, its median kept."""
    import jsonschemabench as jb
    import xgrammar

    from lantern.server import xgrammar_core
    from lantern.server.engine import Generator
    from lantern.server.grammars import compiled_text, vocabulary
    from lantern.server.protocol import ChatCompletionRequest
    from lantern.server.structured import StructuredOutputError, response_format_spec

    generator = Generator(artifact, "tvm")
    tokenizer_json = json.loads((artifact / "tokenizer.json").read_text())
    vocab = vocabulary(tokenizer_json, generator.vocab_size)
    stops = sorted(generator.stop_ids)
    vocab_type = {"byte_level": xgrammar.VocabType.BYTE_LEVEL, "byte_fallback": xgrammar.VocabType.BYTE_FALLBACK}.get(
        generator.token_postproc, xgrammar.VocabType.RAW
    )
    info = xgrammar.TokenizerInfo(vocab, vocab_type, vocab_size=generator.vocab_size, stop_token_ids=stops)
    sides = {
        "core": xgrammar_core.Compiler(vocab, generator.token_postproc, generator.vocab_size, stops).grammar,
        "package": xgrammar.GrammarCompiler(info, cache_enabled=False).compile_grammar,
    }
    rows = jb.load(ROOT.parent / "shared" / "jsonschemabench")
    times: dict[str, list[float]] = {"core": [], "package": []}
    for row in rows[:: max(1, len(rows) // schemas)][:schemas]:
        try:
            req = ChatCompletionRequest(**jb.request_for(row["schema"]))
            text = compiled_text(
                response_format_spec(req.response_format.model_dump(exclude_none=True), req.schema_defaults.model_dump())
            )
        except StructuredOutputError:
            continue
        each: dict[str, list[float]] = {"core": [], "package": []}
        for r in range(3):
            for name in ("core", "package") if r % 2 else ("package", "core"):
                start = time.perf_counter()
                sides[name](text)
                each[name].append(time.perf_counter() - start)
        for name, values in each.items():
            times[name].append(statistics.median(values))
    generator.close()
    p50, p99 = ({k: float(np.percentile(v, q)) for k, v in times.items()} for q in (50, 99))
    print(f"{artifact.name}: {len(times['core'])} schemas, each compiled 3 times per side (its median)")
    for name in times:
        print(f"  {name}: compile p50 {p50[name] * 1000:.0f} ms, p99 {p99[name] * 1000:.0f} ms")
    print(f"  core / package: p50 {p50['core'] / p50['package']:.2f}x, p99 {p99['core'] / p99['package']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("install")
    one.add_argument("artifact", type=Path)
    one.add_argument("--checkout", type=Path, default=ROOT)
    one.add_argument("--extras", default="llamacpp")
    wheels = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lantern" / "wheels"
    found = sorted(wheels.glob("*/llama_cpp_python-*.whl"), key=lambda p: p.stat().st_mtime)
    one.add_argument("--find-links", default=str(found[-1].parent) if found else None, help="a folder of prebuilt wheels")
    two = sub.add_parser("grammars")
    two.add_argument("artifact", type=Path)
    two.add_argument("--schemas", type=int, default=40)
    three = sub.add_parser("core")
    three.add_argument("artifact", type=Path)
    three.add_argument("--schemas", type=int, default=40)
    args = parser.parse_args()
    if args.what == "install":
        install(args.artifact.resolve(), args.checkout.resolve(), args.extras, args.find_links)
    else:
        {"grammars": grammars, "core": core}[args.what](args.artifact, args.schemas)


if __name__ == "__main__":
    main()
