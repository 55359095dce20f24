"""Jinja chat templates translated into WebLLM's conv_template, checked by rendering both."""

import json

import pytest

from tiny_models import write_hf_folder

from lantern.chat_template import render, render_conv_template, to_conv_template
from lantern.errors import LanternError

LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# A template whose turn format depends on the turn number: no flat conv_template can express it.
NUMBERED = (
    "{% for m in messages %}[{{ loop.index }}] {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def test_smollm2_chatml_template(real_tokenizer_dir):
    cfg = json.loads((real_tokenizer_dir / "tokenizer_config.json").read_text())
    # its BOS token is <|im_start|>, which opens every turn: it stays in the text
    conv = to_conv_template(
        cfg["chat_template"],
        bos_token=cfg["bos_token"],
        eos_token="<|im_end|>",
        stop_token_ids=[2],
        name="smollm2",
        bos_token_id=1,
    )
    assert cfg["bos_token"] == "<|im_start|>" and conv["system_prefix_token_ids"] == []
    assert conv["roles"] == {"user": "<|im_start|>user\n", "assistant": "<|im_start|>assistant\n", "tool": "<|im_start|>user\n"}
    assert conv["system_message"].startswith("You are a helpful AI assistant named SmolLM")
    assert conv["stop_str"] == ["<|im_end|>"]


def test_llama3_style_template_round_trips():
    conv = to_conv_template(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", stop_token_ids=[9], name="l3")
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert render_conv_template(conv, messages) == render(LLAMA3, messages, bos_token="<|begin_of_text|>")


def test_llama3_style_template_gets_its_bos_as_a_prefix_token():
    """A template that writes the BOS text itself: WebLLM gets it as an id, before any system block."""
    conv = to_conv_template(
        LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", stop_token_ids=[9], name="l3", bos_token_id=128000
    )
    assert conv["system_prefix_token_ids"] == [128000]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "a"}]
    assert "<|begin_of_text|>" + render_conv_template(conv, messages) == render(LLAMA3, messages, bos_token="<|begin_of_text|>")


def test_gemma3_template_translates_exactly(gemma3_tokenizer_dir):
    """Gemma 3's real template writes the system message inside the first user turn: WebLLM gets a
    system block that opens that turn (no role after it, nothing without a system message), exact
    with and without one."""
    template = json.loads((gemma3_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]
    conv = to_conv_template(
        template, bos_token="<bos>", eos_token="<eos>", stop_token_ids=[1, 106], name="gemma3", bos_token_id=2
    )
    assert conv["system_prefix_token_ids"] == [2] and conv["add_role_after_system_message"] is False
    assert conv["roles"]["user"] == "<start_of_turn>user\n" and conv["stop_str"] == ["<end_of_turn>"]
    turns = [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"}, {"role": "user", "content": "Three"}]
    for messages in (turns, [{"role": "system", "content": "Be brief."}, *turns], turns[:1]):
        assert "<bos>" + render_conv_template(conv, messages) == render(template, messages, bos_token="<bos>")


def test_a_template_that_raises_names_its_reason(gemma3_tokenizer_dir):
    """Gemma's template refuses two user turns in a row; the runtimes answer that with a 400 / an
    InvalidRequestError carrying this message."""
    template = json.loads((gemma3_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]
    with pytest.raises(LanternError, match="chat template failed to render: Conversation roles must alternate"):
        render(template, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], bos_token="<bos>")


def test_untranslatable_template_is_refused():
    with pytest.raises(LanternError, match="does not fit WebLLM"):
        to_conv_template(NUMBERED, bos_token="", eos_token="", stop_token_ids=[], name="n")


def test_build_keeps_going_without_a_conv_template(real_tokenizer_dir, build_artifact, tmp_path_factory):
    folder = tmp_path_factory.mktemp("numbered") / "numbered"
    write_hf_folder(folder, real_tokenizer_dir)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": NUMBERED}))
    art = build_artifact(folder, "q0f32")
    assert json.loads((art / "mlc-chat-config.json").read_text())["conv_template"] is None
    assert json.loads((art / "tokenizer_config.json").read_text())["chat_template"] == NUMBERED
