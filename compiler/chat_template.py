"""Chat templates: render the model's Jinja template, and translate it into WebLLM's conv_template.

Lantern's own runtimes render the Jinja template itself. WebLLM only knows a
flat format (system template, role strings, separators), so at build time the
template is rendered on probe conversations and the pieces are read off the
text. The translation is checked by rendering a longer conversation both ways;
a template that does not fit the flat format is reported, not guessed.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import LanternError

_SYS, _U1, _A1, _U2 = "\x01SYS\x01", "\x01U1\x01", "\x01A1\x01", "\x01U2\x01"


# The reasoning blocks Lantern separates from the answer (reasoning_content), as (open, close) tags.
REASONING_TAGS = (("<think>", "</think>"),)


def reasoning_tags(template: str | None) -> list[str] | None:
    """The (open, close) tags of the reasoning block a chat template writes, or None. Written into
    lantern.json (``model.reasoning_tags``), which both runtimes read."""
    for tags in REASONING_TAGS:
        if template and all(t in template for t in tags):
            return list(tags)
    return None


def render(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list | None = None,
    **extra,
) -> str:
    """Render a Hugging Face chat template the way transformers does; ``extra``: more template
    variables (a request's chat_template_kwargs, such as Qwen3's ``enable_thinking``)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(template).render(
            **extra,
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=tools,
        )
    except jinja2.TemplateError as err:
        raise LanternError(f"chat template failed to render: {err}") from None


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' ``tojson``: keys in their given order, nothing HTML-escaped (Jinja's own filter
    sorts keys and escapes ``<>&'``, so a tool list would render differently from the model's training)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _split(text: str, *markers: str) -> list[str]:
    parts, rest = [], text
    for m in markers:
        if m not in rest:
            raise ValueError("marker missing from rendered template")
        head, rest = rest.split(m, 1)
        parts.append(head)
    return parts + [rest]


def to_conv_template(
    template: str, *, bos_token: str, eos_token: str, stop_token_ids: list[int], name: str, bos_token_id: int | None = None
) -> dict:
    """Translate ``template`` into WebLLM's ``conv_template`` object (verified, or LanternError).

    A template that writes the BOS text itself (``{{ bos_token }}``: Llama 3, Gemma) gets it as
    ``system_prefix_token_ids`` instead, which WebLLM puts first whatever the system block is. A
    template that writes the system message inside the first user turn (Gemma) becomes a system
    block that opens that turn: WebLLM writes no role after it, and nothing without a system message.
    """
    kw: dict[str, Any] = {"bos_token": bos_token, "eos_token": eos_token}
    user = lambda c: {"role": "user", "content": c}  # noqa: E731
    try:
        with_sys = render(
            template, [{"role": "system", "content": _SYS}, user(_U1), {"role": "assistant", "content": _A1}, user(_U2)], **kw
        )
        no_sys = render(template, [user(_U1)], **kw)
    except LanternError as err:
        raise LanternError(f"chat template cannot be probed for WebLLM: {err}") from None
    # a BOS written once, first (not a turn opener that doubles as the BOS, like SmolLM2's <|im_start|>)
    bos_first = (
        bool(bos_token)
        and bos_token_id is not None
        and with_sys.startswith(bos_token)
        and no_sys.startswith(bos_token)
        and with_sys.count(bos_token) == 1
    )
    if bos_first:
        with_sys, no_sys = with_sys[len(bos_token) :], no_sys[len(bos_token) :]
    try:
        pre, sys_to_u1, u1_to_a1, a1_to_u2, tail = _split(with_sys, _SYS, _U1, _A1, _U2)
        default_head = no_sys.split(_U1, 1)[0]  # what the template writes when there is no system message
    except ValueError:
        raise LanternError("chat template drops message text; it cannot be translated for WebLLM") from None
    # u1_to_a1 = sep + assistant header; a1_to_u2 = sep + user header;
    # sys_to_u1 = system suffix + user header; tail = sep + assistant header + empty sep.
    # The separator is the common start of the two turn boundaries, minus any part
    # that also opens the system block (a shared header start like "<|im_start|>").
    common = _common_prefix(u1_to_a1, a1_to_u2)
    cut = next(k for k in range(len(common) + 1) if pre.startswith(common[k:]) or k == len(common))
    sep = common[:cut]
    role_assistant, role_user = u1_to_a1[cut:], a1_to_u2[cut:]
    if not tail.startswith(sep + role_assistant):
        raise LanternError("chat template does not fit WebLLM's conv_template format")
    inside_first_turn = not sys_to_u1.endswith(role_user) and pre.endswith(role_user)
    if sys_to_u1.endswith(role_user):  # a system block of its own, then the first user turn
        system_template = pre + "{system_message}" + sys_to_u1[: len(sys_to_u1) - len(role_user)]
    elif inside_first_turn:  # the system message opens the first user turn (Gemma)
        system_template = pre + "{system_message}" + sys_to_u1
    else:
        raise LanternError("chat template does not fit WebLLM's conv_template format")
    role_empty_sep = tail[len(sep + role_assistant) :]
    system_message = ""
    head_prefix, head_suffix = system_template.split("{system_message}")
    if not inside_first_turn and default_head.startswith(head_prefix) and default_head.endswith(head_suffix + role_user):
        system_message = default_head[len(head_prefix) : len(default_head) - len(head_suffix + role_user)]
    conv = {
        "name": name,
        "system_template": system_template,
        "system_message": system_message,
        "system_prefix_token_ids": [bos_token_id] if bos_first else [],
        "add_role_after_system_message": not inside_first_turn,
        "roles": {"user": role_user, "assistant": role_assistant, "tool": role_user},
        "role_templates": {"user": "{user_message}", "assistant": "{assistant_message}", "tool": "{tool_message}"},
        "messages": [],
        "seps": [sep],
        "role_content_sep": "",
        "role_empty_sep": role_empty_sep,
        "stop_str": [sep.strip() or eos_token],
        "stop_token_ids": stop_token_ids,
        "function_string": "",
        "use_function_calling": False,
    }
    if inside_first_turn:
        conv["render_empty_system_message"] = False  # WebLLM 0.2.86: no system message, no system block
    _verify(template, conv, kw, bos_token if bos_first else "")
    return conv


def render_conv_template(conv: dict, messages: list[dict]) -> str:
    """What WebLLM builds from ``conv`` (its getPromptArray) as text, for checking the translation;
    ``system_prefix_token_ids`` come before it as ids."""
    system = next((m["content"] for m in messages if m["role"] == "system"), conv["system_message"])
    out = conv["system_template"].replace("{system_message}", system)
    if system == "" and conv.get("render_empty_system_message") is False:
        out = ""
    turns = [m for m in messages if m["role"] != "system"]
    for i, m in enumerate(turns):
        role = conv["roles"][m["role"]] + conv["role_content_sep"]
        if i == 0 and out and conv["add_role_after_system_message"] is False:
            role = ""
        out += role + m["content"] + conv["seps"][i % len(conv["seps"])]
    return out + conv["roles"]["assistant"] + conv["role_empty_sep"]


def _verify(template: str, conv: dict, kw: dict, bos_text: str) -> None:
    with_system = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "One"},
        {"role": "assistant", "content": "Two"},
        {"role": "user", "content": "Three"},
        {"role": "assistant", "content": "Four"},
        {"role": "user", "content": "Five"},
    ]
    probes = [with_system]
    # WebLLM always renders its system template, unless told not to for an empty one. A template
    # that writes no system block when no system message is given (Llama 3) then differs by an empty
    # system block, as MLC's own conv templates do; a template with a default system message, or one
    # whose system block opens the first turn, is checked without a system message too.
    if conv["system_message"] or conv.get("render_empty_system_message") is False:
        probes.append([{"role": "user", "content": "Hi there"}])
    for messages in probes:
        if render(template, messages, **kw) != bos_text + render_conv_template(conv, messages):
            raise LanternError("chat template does not fit WebLLM's conv_template format")
