"""Jinja chat templates translated into WebLLM's conv_template, checked by rendering both."""

import json

import pytest

from tiny_models import write_hf_folder

from lantern.chat_template import render, render_conv_template, to_conv_template
from lantern.errors import LanternError

LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
# A template whose turn format depends on the turn number: no flat conv_template can express it.
NUMBERED = ("{% for m in messages %}[{{ loop.index }}] {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


def test_smollm2_chatml_template(real_tokenizer_dir):
    cfg = json.loads((real_tokenizer_dir / "tokenizer_config.json").read_text())
    conv = to_conv_template(cfg["chat_template"], bos_token="", eos_token="<|im_end|>", stop_token_ids=[2],
                            name="smollm2")
    assert conv["roles"] == {"user": "<|im_start|>user\n", "assistant": "<|im_start|>assistant\n",
                             "tool": "<|im_start|>user\n"}
    assert conv["system_message"].startswith("You are a helpful AI assistant named SmolLM")
    assert conv["stop_str"] == ["<|im_end|>"]


def test_llama3_style_template_round_trips():
    conv = to_conv_template(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", stop_token_ids=[9],
                            name="l3")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert render_conv_template(conv, messages) == render(LLAMA3, messages, bos_token="<|begin_of_text|>")


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
