"""The OpenAI request rules of request_rules.json, applied to a request body as it arrived (JSON).

The browser engine reads the same file (webruntime/src/request_rules.ts, its twin line for line), so one
request is accepted or refused alike on both, with the same message. The server's pydantic models
(lantern.server.protocol) run ``checked`` before their own parsing; pydantic then only types what
passed. The table sits at the compiler's layer because an artifact's sampling defaults are held to
its ranges at build time (package.GENERATION_FIELDS).
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

from . import contracts

RULES: dict = contracts.read("request_rules.json")
MESSAGES: dict[str, str] = RULES["messages"]
TOKEN_ID = re.compile(r"^[0-9]+$")


class RuleError(ValueError):
    """A broken rule: ``message`` as both runtimes word it, ``param`` the field's path."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.message, self.param = message, param


def message(name: str, **params: Any) -> str:
    """The template ``name`` with its {placeholders} filled."""
    return _fill(MESSAGES[name], params)


def _fill(template: str, params: dict) -> str:
    """Each {name} replaced by its parameter: a string as it is, anything else as show() writes it."""

    def one(m: re.Match) -> str:
        value = params[m.group(1)]
        return value if isinstance(value, str) else show(value)

    return re.sub(r"\{(\w+)\}", one, template)


def show(value: Any) -> str:
    """``value`` as JavaScript's JSON.stringify writes it (compact, numbers in JavaScript's format)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return _js_number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "{" + ",".join(f"{show(str(k))}:{show(v)}" for k, v in value.items()) + "}"
    return "[" + ",".join(show(v) for v in value) + "]"


def _js_number(x: int | float) -> str:
    """Number.prototype.toString: the shortest round-trip digits, exponent only below 1e-6 or from 1e21."""
    if isinstance(x, int) and abs(x) < 2**53:
        return str(x)
    x = float(x)  # a larger int is the double JavaScript parses it to
    if not math.isfinite(x):
        return "null"  # what JSON.stringify writes for NaN and infinities
    if x == 0:
        return "0"
    _, digits, exp = Decimal(repr(abs(x))).normalize().as_tuple()
    assert isinstance(exp, int)  # x is finite: no NaN or infinity exponent ("n", "N", "F")
    d = "".join(map(str, digits))
    k, n = len(d), len(d) + exp  # the value is 0.d * 10^n
    neg = "-" if x < 0 else ""
    if k <= n <= 21:
        return neg + d + "0" * (n - k)
    if 0 < n <= 21:
        return neg + d[:n] + "." + d[n:]
    if -6 < n <= 0:
        return neg + "0." + "0" * -n + d
    e = n - 1
    return neg + d[0] + ("." + d[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))


def _got(value: Any) -> str:
    """What a message says was sent: the value's JSON, or its kind when that is long."""
    text = show(value)
    if len(text.encode("utf-16-le")) // 2 <= RULES["got_max_chars"]:  # JavaScript counts UTF-16 units
        return text
    return "a string" if isinstance(value, str) else "an object" if isinstance(value, dict) else "an array"


def _is_int(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fail(rule: dict, kind: str, field: str, sent: Any, **params: Any) -> RuleError:
    return RuleError(_fill(rule.get("message") or MESSAGES[kind], {"field": field, "got": _got(sent), **params}), field)


def _check(rule: dict, value: Any, field: str) -> Any:
    """``value`` (present, not null) checked against ``rule``; returns it with nested defaults filled."""
    kind = rule["type"]
    if kind == "string" and not isinstance(value, str):
        raise _fail(rule, "string", field, value)
    if kind == "boolean" and not isinstance(value, bool):
        raise _fail(rule, "boolean", field, value)
    if kind == "enum" and not (isinstance(value, str) and value in rule["values"]):
        raise _fail(rule, "enum", field, value, values=", ".join(rule["values"]))
    if kind == "number":
        if not (_is_number(value) and rule["min"] <= value <= rule["max"]):
            raise _fail(rule, "number", field, value, min=rule["min"], max=rule["max"])
    if kind == "integer":
        lo, hi = rule["min"], rule.get("max")
        if not (_is_int(value) and lo <= value and (hi is None or value <= hi)):
            raise _fail(rule, "integer" if hi is not None else "integer_from", field, value, min=lo, max=hi)
        return int(value)  # 2.0 is an integer in JavaScript (and 1e20 too large for pydantic's float parsing)
    if kind == "strings":
        items = [value] if isinstance(value, str) else value
        if not (isinstance(items, list) and len(items) <= rule["max_items"] and all(isinstance(s, str) and s for s in items)):
            raise _fail(rule, "strings", field, value, max_items=rule["max_items"])
    if kind == "embedding_input" and not _embedding_input(value, rule["max_items"]):
        raise _fail(rule, "embedding_input", field, value, max_items=rule["max_items"])
    if kind in ("object", "token_map") and not isinstance(value, dict):
        raise _fail(rule, "object", field, value)
    if kind == "object" and "fields" in rule:
        return _fields(rule["fields"], value, field + ".")
    if kind == "token_map":
        for key, v in sorted(value.items()):  # in key order on both sides (request_rules.ts says why)
            if not TOKEN_ID.match(key):
                raise _fail(rule, "token_key", field, key)
            _check(rule["value"], v, f"{field}[{key}]")
    if kind == "array":
        if not isinstance(value, list):
            raise _fail(rule, "array", field, value)
        if len(value) < rule.get("min_items", 0):
            raise _fail(rule, "too_few", field, value, min_items=rule["min_items"], count=len(value))
        if "items" in rule:
            return [_check(rule["items"], v, f"{field}[{i}]") for i, v in enumerate(value)]
    return value


def _token_ids(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(_is_int(t) and t >= 0 for t in v)  # 1.0 is 1 in JavaScript


def _embedding_input(value: Any, max_items: int) -> bool:
    """OpenAI's embeddings ``input``: a text, texts, one token list, or token lists (none empty)."""
    if isinstance(value, str):
        return value != ""
    if not isinstance(value, list) or not 0 < len(value) <= max_items:
        return _token_ids(value)  # one token list may be longer than max_items
    return all(isinstance(s, str) and s for s in value) or _token_ids(value) or all(_token_ids(v) for v in value)


def _fields(rules: dict, body: dict, prefix: str = "") -> dict:
    """``body`` checked field by field in the table's order: nulls dropped, defaults filled, other
    fields kept as they are (OpenAI's clients send fields such as `user`)."""
    out = {k: v for k, v in body.items() if not (k in rules and v is None)}
    for name, rule in rules.items():
        field = prefix + name
        if name in out:
            out[name] = _check(rule, out[name], field)
            need = rule.get("requires")
            if need and out.get(need["field"]) != need["value"]:
                raise _fail({}, "requires", field, out[name], other=need["field"], value=need["value"])
        elif rule.get("required") and out.get("role") not in rule.get("optional_for_roles", ()):
            raise RuleError(message("required", field=field), field)
        elif "default" in rule:
            default = rule["default"]
            out[name] = _check(rule, dict(default), field) if isinstance(default, dict) else default
    return out


def checked(body: Any, endpoint: str | None) -> dict:
    """``body`` (a request as JSON) under the rules of ``endpoint`` ("chat", "completions", or None for
    the shared fields only), with nulls dropped and defaults filled; RuleError for the first broken rule."""
    if not isinstance(body, dict):
        raise RuleError(message("body", got=_got(body)), None)
    shared = {} if endpoint in RULES["standalone_endpoints"] else RULES["shared"]
    rules = {**(RULES["endpoints"][endpoint] if endpoint else {}), **shared}
    return _fields(rules, body)


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as the chat template sees them: roles renamed (developer -> system)."""
    names = RULES["template_roles"]
    return [{**m, "role": names.get(m["role"], m["role"])} for m in messages]


def generation_fields() -> dict[str, tuple[float, float, float | None]]:
    """The fields an artifact may carry defaults for: name -> (OpenAI's default, min, max or None)."""
    return {
        name: (rule["fallback"], rule["min"], rule.get("max")) for name, rule in RULES["shared"].items() if "fallback" in rule
    }


def stop_token_ids(chat_config: dict) -> set[int]:
    """The token ids that end a generation, from an artifact's mlc-chat-config.json."""
    ids: set[int] = set()
    for path in RULES["artifact"]["stop_token_ids"]:
        value: Any = chat_config
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        ids |= {int(x) for x in (value if isinstance(value, list) else [value]) if _is_int(x)}
    return ids


def template_knows_tools(template: str | None) -> bool:
    """Whether a chat template renders a request's tools itself."""
    return bool(template and RULES["artifact"]["tools_in_template"] in template)
