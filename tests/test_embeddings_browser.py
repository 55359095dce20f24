"""Embedding models in the page: the real all-MiniLM-L6-v2 (tests/test_embeddings.py builds it) on the
browser's `wasm` device (its wasm library in two encoder workers), through `engine.embeddings.create` in a
dedicated worker, in real Chromium without WebGPU: the same vectors as `lantern serve`'s llamacpp engine
on the same weights' GGUF, OpenAI's shape (token ids, `dimensions`, base64), and the same refusals; its float32
build's WebGPU library on SwiftShader against transformers; the wasm device in Firefox and WebKit; the
router and the retrieval index."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from browser import launch, lantern_server
from test_runtime import open_page

from lantern import request_rules
from lantern.server.embeddings import Embedder

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TEXTS = [
    "The capital of France is Paris.",
    "hello",
    "Café déjà vu, naïve résumé!",
    "中文字符 and 日本語",
    "Retrieval-augmented chat over the user's own documents, with nothing sent to a server, runs in the page.",
    "A much longer sentence about embeddings, retrieval and browsers that run models locally, " * 3,
]


@pytest.fixture(scope="module")
def served(minilm, tmp_path_factory, playwright):
    """`lantern serve` with the model under its manifest's name (the router's cloud must name the local
    model), and a page of Chromium without WebGPU."""
    link = tmp_path_factory.mktemp("served") / "all-minilm-l6-v2"
    link.symlink_to(minilm)
    with lantern_server([link], engine="llamacpp") as (base, seen):
        browser = launch(playwright, webgpu=False)
        try:
            yield base, open_page(browser, base), seen
        finally:
            browser.close()


@pytest.fixture(scope="module")
def minilm_web(build_artifact) -> Path:
    """The unquantized build with the WebGPU library SwiftShader runs (cpu-emulated: the `gpu` one's
    matmul shaders take SwiftShader minutes to compile) and the CPU library (the reference)."""
    from test_embeddings import MODEL

    return build_artifact(MODEL, "q0f32", targets=("webgpu", "cpu"), webgpu_schedule="cpu-emulated")


def test_the_webgpu_device_embeds_as_transformers(minilm_web, cache_dir, shakespeare_text, browser, report):
    """The unquantized build's WebGPU library (the cpu-emulated schedule SwiftShader runs) in the
    origin's SharedWorker, against transformers' BertModel with the folder's mean pooling: texts of 1
    to 20 words of prose, accents and CJK, computed in padded batches of similar lengths."""
    from test_embeddings import MODEL, transformers_vectors

    from lantern.importer import bundled_path

    art = minilm_web
    words = shakespeare_text.split()
    # short texts: SwiftShader runs this library's kernels slowly (~6 tokens/s; one of 250 tokens took 44 s)
    inputs = [" ".join(words[i * 50 : i * 50 + n]) for i, n in enumerate([1, 3, 9])] + TEXTS[:5]
    reference = transformers_vectors(bundled_path(MODEL, cache_dir).with_suffix(""), inputs)
    with lantern_server([art], engine="tvm") as (base, _):
        context = browser.new_context()
        try:
            page = open_page(context, base)
            # in the origin's SharedWorker, as a page gets it by default where WebGPU runs
            stats = page.evaluate("(m) => load(m, { device: 'webgpu', shared: true })", f"/models/{art.name}/")
            out = page.evaluate("(req) => engine.embeddings.create(req)", {"input": inputs})
        finally:
            context.close()
    assert stats["device"] == "webgpu" and out["lantern_device"] == "webgpu" and stats["host"]["kind"] == "shared"
    vectors = np.array([d["embedding"] for d in out["data"]])
    cos = (vectors * reference).sum(1)
    assert cos.min() >= 0.9999, cos
    report(
        f"all-MiniLM-L6-v2 q0f32 on the webgpu device (SwiftShader, {stats['library']}): cosine to transformers min {cos.min():.6f} over {len(inputs)} texts"
    )


def test_the_wasm_device_embeds_as_the_server(minilm, served, report):
    server = Embedder(minilm, "llamacpp")
    try:
        tokens = server.tokens(TEXTS)
        reference = server.embed(tokens)
        long_count = len(server.tokenizer.encode(LONG).ids)
        long_reference = server.embed(server.tokens([LONG], truncate=True))[0]
    finally:
        server.close()
    base, page, _ = served
    model = "/models/all-minilm-l6-v2/"
    refused = page.evaluate("(m) => errorOf(() => load(m, { device: 'webgpu' }))", model)
    assert refused["name"] == "WebGPUUnavailableError"  # this browser has none; `auto` takes the GGUF on the CPU
    stats = page.evaluate("(m) => load(m, { device: 'auto', threads: 2 })", model)
    # the wasm library (relaxed SIMD's: Chromium has it), in two workers that take the call's batches
    # (order kept: the cosines below)
    assert stats["device"] == "wasm" and stats["library"].endswith("-wasm-relaxed.wasm"), stats["library"]
    assert stats["wasm"]["build"] == "encoder" and stats["wasm"]["threads"] == 2

    out = page.evaluate("(req) => engine.embeddings.create(req)", {"input": TEXTS})
    assert out["object"] == "list" and out["lantern_device"] == "wasm"
    assert [d["index"] for d in out["data"]] == list(range(len(TEXTS)))
    vectors = np.array([d["embedding"] for d in out["data"]])
    cos = (vectors * reference).sum(1)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert cos.min() >= 0.9999, cos
    assert out["usage"]["prompt_tokens"] == sum(len(t) for t in tokens)

    ids = page.evaluate("(req) => engine.embeddings.create(req)", {"input": tokens[0]})
    assert np.allclose(ids["data"][0]["embedding"], vectors[0], atol=1e-5)
    cut = page.evaluate("(req) => engine.embeddings.create(req)", {"input": TEXTS[0], "dimensions": 64})
    short = np.array(cut["data"][0]["embedding"])
    assert len(short) == 64 and np.allclose(short, vectors[0][:64] / np.linalg.norm(vectors[0][:64]), atol=1e-5)
    packed = page.evaluate("(req) => engine.embeddings.create(req)", {"input": TEXTS[0], "encoding_format": "base64"})
    assert np.allclose(np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), "<f4"), vectors[0], atol=1e-6)

    def error(req: dict) -> dict:
        return page.evaluate("(req) => errorOf(() => engine.embeddings.create(req))", req)

    empty = error({"input": ""})
    with pytest.raises(request_rules.RuleError) as server_says:
        request_rules.checked({"input": ""}, "embeddings")
    assert empty == {"name": "InvalidRequestError", "message": server_says.value.message, "file": None}
    # the page names a model by its manifest (the server by its folder)
    assert error({"input": "x", "dimensions": 385})["message"] == "dimensions must be at most 384 for all-minilm-l6-v2, got 385"
    assert "outside the vocabulary (0..30521)" in error({"input": [[101, 40000]]})["message"]
    # a text longer than the model takes: refused as the server refuses it, or cut as the server cuts it
    assert long_count > 256
    assert error({"input": LONG})["message"] == (
        f"input[0] is {long_count} tokens; all-minilm-l6-v2 takes at most 256 (send truncate: true to cut it)"
    )
    cut_long = page.evaluate("(req) => engine.embeddings.create(req)", {"input": LONG, "truncate": True})
    assert cut_long["usage"]["prompt_tokens"] == 256
    assert (np.array(cut_long["data"][0]["embedding"]) @ long_reference) >= 0.9999
    chat = page.evaluate("() => errorOf(() => engine.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }] }))")
    assert "is an embedding model: it answers embeddings.create, not text" in chat["message"]
    report(f"all-MiniLM-L6-v2 on the wasm device (2 encoder workers): cosine to lantern serve's llamacpp min {cos.min():.6f}")


@pytest.mark.parametrize("name", ["firefox", "webkit"])
def test_the_wasm_device_embeds_in_firefox_and_webkit(name, minilm, served, report):
    """Gecko and WebKit (JavaScriptCore: llama.cpp's compat build) give the vectors Chromium's wasm device
    and `lantern serve` give, as the server tokenizes (tests/test_browsers.py runs chat there)."""
    from test_browsers import engine_page, in_browser

    server = Embedder(minilm, "llamacpp")
    try:
        reference = server.embed(server.tokens(TEXTS))
    finally:
        server.close()
    base, _, _ = served

    def run(browser) -> tuple[dict, dict]:
        page = engine_page(browser, base)
        stats = page.evaluate("(m) => load(m, { device: 'auto', threads: 1 })", "/models/all-minilm-l6-v2/")
        return stats, page.evaluate("(req) => engine.embeddings.create(req)", {"input": TEXTS})

    stats, out = in_browser(name, run)
    assert stats["device"] == "wasm" and out["lantern_device"] == "wasm" and stats["wasm"]["build"] == "encoder"
    cos = (np.array([d["embedding"] for d in out["data"]]) * reference).sum(1)
    assert cos.min() >= 0.9999, (name, cos)
    report(
        f"all-MiniLM-L6-v2 on the wasm device in {name} ({stats['library']}): "
        f"cosine to lantern serve's llamacpp min {cos.min():.6f}"
    )


ZARNIA = (
    "Zarnia is a small island nation in the northern sea. Its capital is Lumen, a harbour city of forty "
    "thousand people. Most Zarnians fish or keep sheep."
)
LONG = " ".join(f"Sentence {i} of a long report on harbours, wool, weather and the sea" for i in range(40))  # ~2,700 chars


def test_the_router_and_the_retrieval_index(served, report):
    """The router's `embeddings.create` answers locally and, asked to, from `lantern serve` with the same
    vectors; it refuses a cloud model of another name. `openIndex` chunks, embeds, keeps the chunks in
    IndexedDB (a second open finds them), finds the passage a question is about, halves a chunk the
    model finds too long, and refuses vectors of another model."""
    base, page, seen = served
    local = {"model": "/models/all-minilm-l6-v2/", "device": "auto", "threads": 1, "shared": False}
    cloud = {"baseURL": base + "/v1", "model": "all-minilm-l6-v2"}
    out = page.evaluate(
        """async ({ local, cloud, texts }) => {
            const events = [];
            window.router = await lantern.createRouter({ local, cloud, onEvent: (e) => events.push(e) });
            const here = await router.embeddings.create({ input: texts });
            const there = await router.embeddings.create({ input: texts, dimensions: 128 }, { route: "cloud" });
            const other = await lantern.createRouter({ local, cloud: { ...cloud, model: "another-model" } });
            const refused = await errorOf(() => other.embeddings.create({ input: texts }, { route: "cloud" }));
            await other.local.unload();
            // a signal aborted before the call: an AbortError, and neither the local engine nor the cloud runs
            const ctrl = new AbortController();
            ctrl.abort();
            const gone = ctrl.signal;
            const chat = { messages: [{ role: "user", content: "hi" }], max_tokens: 4 };
            const aborted = [
                await errorOf(() => router.embeddings.create({ input: texts }, { signal: gone })),
                await errorOf(() => router.chat.completions.create(chat, { signal: gone })),
                await errorOf(async () => {
                    for await (const _ of await router.chat.completions.create({ ...chat, stream: true }, { signal: gone }));
                }),
            ];
            return { here, there, refused, aborted, fallbacks: events.filter((e) => e.type === "fallback") };
        }""",
        {"local": local, "cloud": cloud, "texts": TEXTS},
    )
    here, there = out["here"], out["there"]
    assert here["lantern_route"] == "local" and here["lantern_device"] == "wasm" and there["lantern_route"] == "cloud"
    a = np.array([d["embedding"] for d in here["data"]])[:, :128]
    b = np.array([d["embedding"] for d in there["data"]])
    cos = (a / np.linalg.norm(a, axis=1, keepdims=True) * b).sum(1)
    assert b.shape == (len(TEXTS), 128) and cos.min() >= 0.9999, cos
    assert ("/v1/embeddings", None) in seen
    assert [e["name"] for e in out["aborted"]] == ["AbortError"] * 3 and out["fallbacks"] == []
    assert not any(path.startswith("/v1/chat") for path, _ in seen)
    assert out["refused"]["name"] == "ModelMismatchError"
    assert 'the cloud model "another-model" is not the local model "all-minilm-l6-v2"' in out["refused"]["message"]

    docs = [
        {"id": "zarnia", "title": "Zarnia", "text": ZARNIA},
        {"id": "baking", "text": "Sourdough rises with a starter of wild yeast. Feed it flour and water every day."},
        {"id": "long", "title": "Report", "text": LONG},
    ]
    got = page.evaluate(
        """async (docs) => {
            const index = await lantern.openIndex("test-documents", router);
            await index.clear();
            const chunks = await index.add(docs.slice(0, 2), { maxChars: 120, batch: 2 });
            // one 2,700-character chunk: more tokens than the model takes, so it is halved until each piece fits
            const long = await index.add(docs[2], { maxChars: 4000 });
            const hits = await index.search("Which city is the capital of Zarnia?", 3);
            const again = await lantern.openIndex("test-documents", router);
            const stub = { embeddings: { create: async (req) => ({ object: "list", model: "another-model",
              data: req.input.map((_, index) => ({ object: "embedding", index, embedding: new Array(384).fill(0.05) })),
              usage: { prompt_tokens: 1, total_tokens: 1 } }) } };
            const mixed = await errorOf(async () => (await lantern.openIndex("test-documents", stub)).search("x"));
            return { chunks, long, hits, size: again.size, model: again.model, docs: again.documents(), mixed };
        }""",
        docs,
    )
    texts = {d["id"]: d["text"] for d in docs}
    for c in got["chunks"] + got["long"]:
        assert texts[c["doc"]][c["start"] : c["start"] + len(c["text"])] == c["text"], c
    assert [c["doc"] for c in got["chunks"]].count("zarnia") == 2  # two sentences per chunk at 120 characters
    assert 2 <= len(got["long"]) <= 8 and max(len(c["text"]) for c in got["long"]) < 2000
    assert got["hits"][0]["doc"] == "zarnia" and "Lumen" in got["hits"][0]["text"], got["hits"]
    assert got["hits"][0]["score"] > got["hits"][1]["score"]
    assert got["size"] == len(got["chunks"]) + len(got["long"]) and got["model"] == "all-minilm-l6-v2"
    assert [d["id"] for d in got["docs"]] == ["baking", "long", "zarnia"]
    assert got["mixed"]["name"] == "ModelMismatchError" and "holds vectors of all-minilm-l6-v2" in got["mixed"]["message"]
    report(
        f"router: local vs cloud cosine min {cos.min():.6f} (128 dimensions); index: {got['size']} chunks, "
        f"the long one cut in {len(got['long'])}, top hit {got['hits'][0]['score']:.3f} vs {got['hits'][1]['score']:.3f}"
    )


def test_lantern_validate_checks_an_embedding_model(minilm_web, tmp_path, report):
    """`lantern validate` on an embedding artifact, as CI runs it: Chromium's webgpu vectors of held-out
    texts against the CPU library's, embeddings per second, loads and pipelines, against a budget whose
    cosine floor holds and whose speed floor cannot (exit 1, naming it)."""
    budget = tmp_path / "budget.toml"
    budget.write_text("[correctness]\nmin_cosine = 0.9999\n[speed]\nmin_embed_texts_per_s = 100000\nmax_load_s_cold = 300\n")
    out = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lantern.cli",
            "validate",
            str(minilm_web),
            "--texts",
            "2",
            "--budget",
            str(budget),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert "budget breached: speed.min_embed_texts_per_s" in run.stderr
    result = json.loads(out.read_text())
    checks = {c["name"]: c["status"] for c in result["checks"]}
    metrics = result["metrics"]
    assert checks["correctness.min_cosine"] == "pass" and checks["speed.max_load_s_cold"] == "pass"
    assert checks["speed.min_embed_texts_per_s"] == "fail"
    assert all(status == "pass" for name, status in checks.items() if name.startswith("pipelines:")), checks
    assert sum(name.startswith("pipelines:") for name in checks) == 1  # the WebGPU library compiled
    assert metrics["min_cosine"] >= 0.9999 and metrics["embed_texts_per_s"] > 0 and "greedy" not in metrics
    report(
        f"lantern validate (all-MiniLM-L6-v2 q0f32, SwiftShader): min cosine {metrics['min_cosine']:.6f}, "
        f"{metrics['embed_texts_per_s']:.2f} texts/s, cold load {metrics['load_s_cold']:.1f} s"
    )
