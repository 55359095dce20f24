"""A Lantern artifact loads and chats in the unmodified WebLLM engine (@mlc-ai/web-llm 0.2.86)."""

import pytest

from browser import chromium, repo_root, serve
from test_smollm2 import MAX_TOKENS, PROMPTS, eos_id, prompt_ids

from lantern.artifact import Artifact

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build, pytest.mark.slow]

WEBLLM = repo_root() / "webruntime" / "node_modules" / "@mlc-ai" / "web-llm" / "lib"


def test_webllm_greedy_answer_equals_cpu_library(build_artifact):
    art = Artifact.open(build_artifact("smollm2", "q4f32_1", targets=("webgpu", "cpu")))
    lib = next(x["file"] for x in art.manifest["libraries"] if x["target"] == "webgpu")
    # WebLLM appends resolve/main/ to a model URL unless it already holds /resolve/<rev>/
    routes = {"/webllm/": WEBLLM, "/page/": repo_root() / "tests" / "web", "/models/m/resolve/main/": art.path}
    messages = [{"role": "user", "content": PROMPTS[0]}]
    with serve(routes) as base, chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/page/webllm_chat.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        reply = page.evaluate("([m, l, msgs, n]) => webllmChat(m, l, msgs, n)",
                              [f"{base}/models/m/resolve/main/", f"{base}/models/m/resolve/main/{lib}",
                               messages, MAX_TOKENS])
    text = reply["choices"][0]["message"]["content"]
    expected = art.cpu_model().greedy(prompt_ids(art, PROMPTS[0]), MAX_TOKENS, stop_ids=[eos_id(art)])
    assert text == art.tokenizer().decode(expected)
    assert "Paris" in text
