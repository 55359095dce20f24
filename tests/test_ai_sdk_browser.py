"""The Vercel AI SDK in the browser: the real `ai` package (and zod), bundled for the test page with
esbuild, calls Lantern's provider (`/runtime/ai-sdk.js`, `createLantern`) in headless Chromium.

The tiny random model answers: these tests are about the SDK's contract (part types, usage, the
schema-valid object, the tool loop, abort, errors), which holds for any words. Each case runs on both
browser devices (`wasm`: the GGUF on llama.cpp; `webgpu`: SwiftShader), and once through the cloud
route (`lantern serve`).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from browser import lantern_server, repo_root
from test_qwen_template import thinking_requests
from test_runtime import open_page

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build]

WEBRUNTIME = repo_root() / "webruntime"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """tests/web's AI SDK page with its bundle: `ai` and zod from webruntime's node_modules."""
    folder = tmp_path_factory.mktemp("ai-sdk-site")
    shutil.copy(repo_root() / "tests" / "web" / "ai_sdk.html", folder)
    subprocess.run(
        [
            str(WEBRUNTIME / "node_modules" / ".bin" / "esbuild"),
            str(repo_root() / "tests" / "web" / "ai_sdk.js"),
            "--bundle",
            "--format=esm",
            "--platform=browser",
            "--external:/runtime/*",
            "--log-level=warning",
            f"--outfile={folder / 'ai_sdk.bundle.js'}",
        ],
        check=True,
        env={**os.environ, "NODE_PATH": str(WEBRUNTIME / "node_modules")},
    )
    # open_page waits for engine.html's "ready"; the AI SDK page says the same
    shutil.copy(folder / "ai_sdk.html", folder / "engine.html")
    return folder


@pytest.fixture(scope="module")
def server(tiny_q4, site):
    with lantern_server([tiny_q4.path], site=site) as (base, seen):
        yield base


@pytest.fixture(scope="module", params=["wasm", "webgpu"])
def page(request, browser, server, tiny_q4):
    context = browser.new_context()
    p = open_page(context, server)
    # one llama.cpp thread on wasm: the suite runs a test file per core (see test_wasm_device.py's session)
    p.evaluate("(s) => setup(s)", {"model": f"/models/{tiny_q4.path.name}/", "engine": {"device": request.param, "threads": 1}})
    p.device = request.param
    yield p
    context.close()


def test_stream_text_gives_the_engines_own_answer_in_the_sdks_parts(page):
    out = page.evaluate("streamCase({ prompt: 'Name three colors.', maxOutputTokens: 12 })")
    plain = page.evaluate(
        "plain({ messages: [{ role: 'user', content: 'Name three colors.' }], max_tokens: 12, temperature: 0 })"
    )
    assert out["text"] == plain["choices"][0]["message"]["content"]
    assert out["usage"]["inputTokens"] == plain["usage"]["prompt_tokens"]
    assert out["usage"]["outputTokens"] == plain["usage"]["completion_tokens"] == 12
    assert out["finishReason"] == "length"
    parts = out["parts"]
    assert parts[:3] == ["start", "start-step", "text-start"] and parts[-3:] == ["text-end", "finish-step", "finish"]
    assert set(parts[3:-3]) == {"text-delta"}
    assert out["metadata"]["route"] == "local" and out["metadata"]["device"] == page.device
    assert out["metadata"]["decodeTokensPerSecond"] > 0


def test_output_object_is_a_schema_valid_object(page):
    out = page.evaluate("objectCase()")
    obj = out["output"]
    assert out["valid"] and set(obj) == {"city", "population", "capital"}
    assert isinstance(obj["capital"], bool) and 0 <= obj["population"] <= 1000000 and len(obj["city"]) <= 12
    assert out["body"]["response_format"]["type"] == "json_schema"  # Lantern's exact grammar, not a prompt


def test_a_tool_loop_runs_the_tool_and_answers_from_its_result(page):
    out = page.evaluate("toolCase()")
    first, second = out["steps"]
    assert first["finishReason"] == "tool-calls"
    [call] = first["toolCalls"]
    assert call["name"] == "get_weather" and out["ran"] == [call["input"]["city"]]
    assert first["toolResults"] == [{"city": call["input"]["city"], "celsius": 21}]
    # the second request carries the call and its result; it answers in text
    tool_msgs = [m for m in second["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and '"celsius":21' in tool_msgs[0]["content"]
    assert [m for m in second["messages"] if m.get("tool_calls")][0]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert second["toolCalls"] == [] and second["finishReason"] in ("stop", "length")


def test_abort_mid_stream_ends_with_an_abort_part_and_the_engine_answers_next(page):
    out = page.evaluate("abortCase(3)")
    assert out["deltas"] == 3 and out["parts"][-1] == "abort" and out["aborted"] == 1
    assert "finish" not in out["parts"]
    again = page.evaluate("streamCase({ prompt: 'Hi', maxOutputTokens: 4 })")
    assert again["usage"]["outputTokens"] == 4
    stats = page.evaluate("stats()")
    assert stats["kvSequences"] <= 1 and stats["queued"] == 0
    assert stats["requests"].get("cancelled", 0) >= 1


def test_an_image_part_is_unsupported_functionality_naming_the_part(page):
    err = page.evaluate("errorCase('image')")
    assert err["unsupported"] and "file part (image" in err["functionality"] and "user message 0" in err["message"]


def test_a_tool_schema_lantern_refuses_is_an_api_call_error_with_lanterns_message(page):
    err = page.evaluate("errorCase('refused-tool')")
    assert err["apiCall"] and err["status"] == 400 and err["lantern"] == "InvalidRequestError"
    assert "multipleOf" in err["message"]


def test_the_cloud_route_gives_the_same_parts(browser, server, tiny_q4):
    name = tiny_q4.path.name
    context = browser.new_context()
    try:
        p = open_page(context, server)
        p.evaluate(
            "(s) => setup(s)",
            {"model": f"/models/{name}/", "policy": "cloud", "cloud": {"baseURL": server + "/v1", "model": name}},
        )
        out = p.evaluate("streamCase({ prompt: 'Name three colors.', maxOutputTokens: 12 })")
        obj = p.evaluate("objectCase()")
        events = p.evaluate("routerEvents()")
    finally:
        context.close()
    assert out["metadata"]["route"] == "cloud" and out["usage"]["outputTokens"] == 12
    parts = out["parts"]
    assert parts[:3] == ["start", "start-step", "text-start"] and parts[-3:] == ["text-end", "finish-step", "finish"]
    assert obj["valid"] and obj["metadata"]["route"] == "cloud"
    assert {e["route"] for e in events if e["type"] == "route"} == {"cloud"}


def test_embed_many_on_an_embedding_model_local_and_cloud(minilm, tiny_q4, browser, site, tmp_path, report):
    """`embedMany` and `embed` on the real all-MiniLM-L6-v2 through `provider.embeddingModel()`: the
    values cut into calls of `maxEmbeddingsPerCall`, the vectors of the engine's own call, the cloud
    route with the same vector, abort, and a chat model's 400 as an APICallError."""
    link = tmp_path / "all-minilm-l6-v2"  # served under the model's own name, as the router requires
    link.symlink_to(minilm)
    values = [f"Note {i}: the harbour of Lumen is busy in spring." for i in range(9)]
    with lantern_server([link, tiny_q4.path], site=site, engine="llamacpp") as (base, _):
        context = browser.new_context()
        try:
            p = open_page(context, base)
            p.evaluate(
                "(s) => setup(s)",
                {
                    "model": "/models/all-minilm-l6-v2/",
                    "engine": {"threads": 1},
                    "cloud": {"baseURL": base + "/v1"},
                    "maxEmbeddingsPerCall": 4,
                },
            )
            out = p.evaluate(
                "(a) => embedCase(a)",
                {"values": values, "chat": {"model": f"/models/{tiny_q4.path.name}/", "engine": {"threads": 1}}},
            )
        finally:
            context.close()
    vectors = np.array(out["embeddings"])
    assert vectors.shape == (9, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert np.allclose(vectors, [d["embedding"] for d in out["direct"]["data"]], atol=1e-6)  # the router's own answer
    assert out["perCall"] == 4 and out["calls"] == 3  # 4 + 4 + 1
    assert out["usage"]["tokens"] > 9 and out["metadata"] == {"route": "local", "device": "wasm"}
    assert out["cloudRoute"] == "cloud" and out["cloudCosine"] >= 0.9999
    assert out["aborted"] == "AbortError"
    assert out["wrong"]["name"] == "AI_APICallError" and out["wrong"]["status"] == 400
    assert "is a chat model: it has no pooling for embeddings" in out["wrong"]["message"]
    report(f"AI SDK embedMany: 9 texts in {out['calls']} calls, local vs cloud cosine {out['cloudCosine']:.6f}")


@pytest.mark.slow  # Qwen's 151,669-token vocabulary (the tiny model is shared with test_qwen_template)
def test_a_thinking_answer_streams_as_reasoning_parts_then_text(qwen3, qwen3_tokenizer_dir, browser, site, report):
    """The tiny Qwen3 (Qwen's template, pushed towards <think> blocks) on the wasm device: the SDK's
    reasoning and text deltas are the engine's own reasoning_content and content."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))
    with lantern_server([qwen3.path], site=site) as (base, _):
        context = browser.new_context()
        try:
            p = open_page(context, base)
            p.evaluate("(s) => setup(s)", {"model": f"/models/{qwen3.path.name}/", "engine": {"device": "wasm"}})
            with_reasoning = 0
            for req in thinking_requests(hf, 8):
                # opening the block first is likelier than anything else; closing it comes next
                req["logit_bias"][str(hf.convert_tokens_to_ids("<think>"))] = 14.0
                out = p.evaluate("(r) => reasoningCase(r)", req)
                plain = p.evaluate("(r) => plain(r)", req)["choices"][0]["message"]
                assert (out["reasoning"], out["text"]) == (plain["reasoning_content"], plain["content"])
                assert out["reasoningText"] == plain["reasoning_content"]
                if out["reasoning"]:
                    with_reasoning += 1
                    assert {"reasoning-start", "reasoning-delta", "reasoning-end"} <= set(out["parts"])
                    if out["text"]:
                        assert out["parts"].index("reasoning-end") < out["parts"].index("text-start")
            assert with_reasoning >= 1
            report(f"AI SDK reasoning parts: {with_reasoning} of 8 biased Qwen3 answers opened a <think> block")
        finally:
            context.close()
