"""Structured output and tool calls for the server: requests to grammar specs, and tool-call text.

A request's `response_format` or `tools` becomes one grammar spec, which grammars.py compiles with
xgrammar against the model's vocabulary. The specs, schema checks and exact rules are written once, in
TypeScript (webruntime/src/structured.ts), and run here in V8 (schema_host.py); this module asks for
them and holds the tool-call text format, the twin of structured.ts's (tests/test_structured.py holds
the twins equal).

Tool calls, for a model whose chat template does not know tools, use this format (documented in
docs/structured-output.md): the tools are listed in the system message, and a call is written as
    <tool_call>{"name": "<function>", "arguments": {...}}</tool_call>
which the grammar enforces once the model opens the tag (or from the first token, for
`tool_choice: "required"` or a named function).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field


from .. import contracts
from ..errors import LanternError
from .schema_host import HOST, HostRefusal

SUPPORT = contracts.read("schema_support.json")
COMPILE_LIMITS = SUPPORT["compile_limits"]

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


class StructuredOutputError(LanternError):
    """A response_format, schema, grammar or tool definition Lantern cannot honour (HTTP 400)."""


# ---- schemas and specs: the one copy in TypeScript, run in V8 (schema_host.py) -----------------------


def ask_host(name: str, *args):
    """The compiler's answer for ``name`` (schema-host.ts's CALLS); a refusal as StructuredOutputError."""
    try:
        return HOST.call(name, *args)
    except HostRefusal as err:
        raise StructuredOutputError(str(err)) from None


def check_schema(schema, where: str = "#", defaults: dict | None = None, warnings: list | None = None) -> dict | bool:
    """A copy of ``schema`` that xgrammar enforces exactly, or StructuredOutputError naming the keyword;
    ``defaults`` bound the strings and arrays it leaves unbounded. The schema is first rewritten into
    Lantern's dialect (normalize.ts); what that ignored is appended to ``warnings``."""
    out = ask_host("checkSchema", schema, where, defaults or {})
    if warnings is not None:
        warnings.extend(n for n in out["warnings"] if n not in warnings)
    return out["schema"]


# ---- requests -> grammar specs ------------------------------------------------------------------


@dataclass(frozen=True)
class GrammarSpec:
    """What xgrammar compiles: kind is "json_schema" (a JSON text), "ebnf", or "structural_tag" (JSON)."""

    kind: str
    source: str
    warnings: tuple[str, ...] = field(default=(), compare=False)  # what the schemas' rewrite ignored


def grammar_size(schema) -> int:
    """The size compile_limits bounds, read from a checked schema (structured.ts's grammarSize)."""
    return ask_host("grammarSize", schema)


def _spec(out: dict | None) -> GrammarSpec | None:
    return GrammarSpec(out["kind"], out["source"], tuple(out.get("warnings", ()))) if out else None


def response_format_spec(fmt: dict | None, defaults: dict | None = None) -> GrammarSpec | None:
    """The grammar for a `response_format` (OpenAI's, WebLLM's, and Lantern's grammar/regex forms)."""
    return _spec(ask_host("responseFormatSpec", fmt, defaults or {}))


def calls_tools(tools: list[dict], choice) -> bool:
    """Whether a request may produce tool calls."""
    return bool(tools) and choice != "none"


def request_spec(
    response_format: dict | None, tools: list[dict], tool_choice, parallel: bool, defaults: dict | None = None
) -> GrammarSpec | None:
    """The one grammar a chat request asks for (structured.ts's requestSpec): from its tools, or from its
    response_format. ``defaults``: the request's schema_defaults (bounds for unbounded strings and arrays);
    None: no bounds. A request that asks for neither is answered here, without a call into V8: every plain
    chat request comes this way, on the event loop."""
    if not response_format and not tools and tool_choice in (None, "none", "auto"):
        return None
    request = {
        "response_format": response_format,
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        "schema_defaults": defaults or {},
    }
    return _spec(ask_host("requestSpec", request))


def tool_system_prompt(tools: list[dict]) -> str:
    """Lantern's default tool instructions, appended to the system message."""
    lines = [
        json.dumps(
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "parameters": t["function"].get("parameters") or {"type": "object", "properties": {}},
            }
        )
        for t in tools
    ]
    return (
        "You can call these tools:\n" + "\n".join(lines) + "\nTo call a tool, reply with "
        f'{TOOL_OPEN}{{"name": <tool name>, "arguments": <JSON arguments>}}{TOOL_CLOSE}'
    )


def tool_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Messages in Lantern's default tool format, for a chat template that does not know tools."""
    out = [dict(m) for m in messages]
    for m in out:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "".join(
                f'{TOOL_OPEN}{{"name": {json.dumps(c["function"]["name"])}, '
                f'"arguments": {c["function"]["arguments"]}}}{TOOL_CLOSE}'
                for c in m.pop("tool_calls")
            )
            m["content"] = (m.get("content") or "") + calls
        elif m["role"] == "tool":
            m.pop("tool_call_id", None)
            m.update(role="user", content=f"<tool_response>\n{m.get('content') or ''}\n</tool_response>")
        if m.get("content") is None:
            m["content"] = ""
    if tools:
        extra = tool_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{extra}"
        else:
            out.insert(0, {"role": "system", "content": extra})
    return out


_CALL = re.compile(re.escape(TOOL_OPEN) + r"(.*?)" + re.escape(TOOL_CLOSE), re.S)
# The grammar writes `{"name": <string>, "arguments": <JSON>}`; the arguments are kept as written.
_CALL_BODY = re.compile(r'^\{"name": ("(?:[^"\\]|\\.)*"), "arguments": (.*)\}$', re.S)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """Split generated text into content and OpenAI tool_calls (arguments as JSON text)."""
    calls = []
    for body in _CALL.findall(text):
        m = _CALL_BODY.match(body)
        try:
            if not m:
                continue
            json.loads(m[2])
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": json.loads(m[1]), "arguments": m[2]},
                }
            )
        except json.JSONDecodeError:
            continue  # only reachable when max_tokens cut a call short; the text stays content
    if not calls:
        return text, calls
    return cut_open_call(_CALL.sub("", text)).strip() or None, calls


def cut_open_call(text: str) -> str:
    """Drop a tool call that max_tokens cut off before its closing tag."""
    if TOOL_OPEN in text:
        return text[: text.rindex(TOOL_OPEN)]
    for k in range(len(TOOL_OPEN) - 1, 0, -1):
        if text.endswith(TOOL_OPEN[:k]):
            return text[:-k]
    return text
