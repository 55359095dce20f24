"""Embedding models in the page: the real all-MiniLM-L6-v2 (tests/test_embeddings.py builds it) on the
browser's `wasm` device (llama.cpp in wasm, wllama's embeddings), through `engine.embeddings.create` in a
dedicated worker, in real Chromium without WebGPU: the same vectors as `lantern serve`'s llamacpp engine
on the same GGUF, OpenAI's shape (token ids, `dimensions`, base64), and the same refusals."""

from __future__ import annotations

import base64

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


def test_the_wasm_device_embeds_as_the_server(minilm, playwright, report):
    server = Embedder(minilm, "llamacpp")
    try:
        tokens = server.tokens(TEXTS)
        reference = server.embed(tokens)
    finally:
        server.close()
    with lantern_server([minilm]) as (base, _):
        browser = launch(playwright, webgpu=False)
        try:
            page = open_page(browser, base)
            model = f"/models/{minilm.name}/"
            refused = page.evaluate("(m) => errorOf(() => load(m, { device: 'webgpu' }))", model)
            assert refused["name"] == "InvalidRequestError" and "run on the wasm device for now" in refused["message"]
            stats = page.evaluate("(m) => load(m, { device: 'auto', threads: 1 })", model)
            assert stats["device"] == "wasm"

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
            assert (
                error({"input": "x", "dimensions": 385})["message"]
                == "dimensions must be at most 384 for all-minilm-l6-v2, got 385"
            )
            assert "outside the vocabulary (0..30521)" in error({"input": [[101, 40000]]})["message"]
            chat = page.evaluate(
                "() => errorOf(() => engine.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }] }))"
            )
            assert "is an embedding model: it answers embeddings.create, not text" in chat["message"]
            report(f"all-MiniLM-L6-v2 on the wasm device (1 thread): cosine to lantern serve's llamacpp min {cos.min():.6f}")
        finally:
            browser.close()
