"""A Lantern artifact loads and chats in the unmodified WebLLM engine (@mlc-ai/web-llm 0.2.86)."""

import json

import pytest

from browser import webllm_chat
from conftest import DEFAULT_TARGETS
from test_smollm2 import MAX_TOKENS, PROMPTS, eos_id, prompt_ids

from lantern.runtime.artifact import Artifact

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build, pytest.mark.slow]


def test_webllm_greedy_answer_equals_cpu_library(build_artifact):
    """The default artifact (both schedules): WebLLM runs the library Lantern picks on SwiftShader; the
    library mlc-chat-config.json names for WebLLM users is the one for real GPUs.

    Built with `--temperature 0` (a cache hit of the shared build) and asked with no sampling fields:
    WebLLM answers greedily only if it reads the artifact's default from mlc-chat-config.json."""
    art = Artifact.open(build_artifact("smollm2", "q4f32_1", targets=DEFAULT_TARGETS, generation={"temperature": 0}))
    chat_config = json.loads((art.path / "mlc-chat-config.json").read_text())
    assert chat_config["model_lib"] == art.library("webgpu").name == "smollm2-q4f32_1-webgpu.wasm"
    assert chat_config["temperature"] == 0 and art.manifest["generation"]["temperature"] == 0
    reply = webllm_chat(art, [{"role": "user", "content": PROMPTS[0]}], MAX_TOKENS, sampling={})
    text = reply["choices"][0]["message"]["content"]
    expected = art.cpu_model().greedy(prompt_ids(art, PROMPTS[0]), MAX_TOKENS, stop_ids=[eos_id(art)])
    assert text == art.tokenizer().decode(expected)
    assert "Paris" in text
