"""A Lantern artifact loads and chats in the unmodified WebLLM engine (@mlc-ai/web-llm 0.2.86)."""

import pytest

from browser import webllm_chat
from test_smollm2 import MAX_TOKENS, PROMPTS, eos_id, prompt_ids

from lantern.artifact import Artifact

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build, pytest.mark.slow]


def test_webllm_greedy_answer_equals_cpu_library(build_artifact):
    art = Artifact.open(build_artifact("smollm2", "q4f32_1", targets=("webgpu", "cpu")))
    reply = webllm_chat(art, [{"role": "user", "content": PROMPTS[0]}], MAX_TOKENS)
    text = reply["choices"][0]["message"]["content"]
    expected = art.cpu_model().greedy(prompt_ids(art, PROMPTS[0]), MAX_TOKENS, stop_ids=[eos_id(art)])
    assert text == art.tokenizer().decode(expected)
    assert "Paris" in text
