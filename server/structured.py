"""Structured output and tool calls for the server engine, with xgrammar.

A request's `response_format` or `tools` becomes one grammar spec; xgrammar compiles it against
the model's vocabulary and, at every step, masks the tokens the grammar forbids before the sampler
chooses. The browser twin is webruntime/src/structured.ts: the same specs, the same schema
checks (from schema_support.json), the same tool-call format, and xgrammar 0.1.27 on both sides.

Tool calls, for a model whose chat template does not know tools, use this format (documented in
docs/structured-output.md): the tools are listed in the system message, and a call is written as
    <tool_call>{"name": "<function>", "arguments": {...}}</tool_call>
which the grammar enforces once the model opens the tag (or from the first token, for
`tool_choice: "required"` or a named function).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import LanternError
from . import number_grammar, schema_normalize, string_grammar, unique_grammar

if TYPE_CHECKING:
    import xgrammar

SUPPORT = json.loads((Path(__file__).with_name("schema_support.json")).read_text())
_KEYWORDS = set(SUPPORT["keywords"])
_FORMATS = set(SUPPORT["formats"])
_FORMAT_PATTERNS = SUPPORT["format_patterns"]
COMPILE_LIMITS = SUPPORT["compile_limits"]

# The JSON texts the grammar allows: one line, OpenAI's separators (no runs of whitespace to loop on).
JSON_LAYOUT: dict[str, Any] = {"any_whitespace": False, "indent": None, "separators": (", ", ": "), "strict_mode": True}

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


class StructuredOutputError(LanternError):
    """A response_format, schema, grammar or tool definition Lantern cannot honour (HTTP 400)."""


# ---- schemas ----------------------------------------------------------------------------------

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "propertyNames")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_NUMERIC = (*_BOUNDS, "multipleOf")
_LENGTHS = ("minLength", "maxLength")
# A placeholder as xgrammar prints it inside a rule: the JSON string literal, quotes escaped.
PLACEHOLDER_IN_EBNF = re.compile(r'"\\"(lantern:([a-z]+)(?::[-0-9a-z=.]+)*)\\""')


def check_schema(schema, where: str = "#", defaults: dict | None = None, warnings: list | None = None) -> dict | bool:
    """A copy of ``schema`` that xgrammar enforces exactly, or StructuredOutputError naming the keyword.

    The schema is first rewritten into Lantern's dialect (schema_normalize: drafts, annotations and
    unknown keywords, allOf, not, conditionals); what that ignored is appended to ``warnings``.
    """
    try:
        normalized, notes = schema_normalize.normalize(schema, where)
    except schema_normalize.SchemaError as err:
        raise StructuredOutputError(str(err)) from None
    if warnings is not None:
        warnings.extend(n for n in notes if n not in warnings)
    return _check(normalized, where, defaults)


def _check(schema, where: str, defaults: dict | None) -> dict | bool:
    """check_schema on a normalized schema.

    xgrammar ignores keywords it does not know and its numeric ranges and some formats are
    inexact, so: keywords and formats outside schema_support.json are rejected; formats in `format_patterns` become
    exact patterns; a number or integer with bounds or multipleOf, a string with a pattern or
    lengths, and an array with uniqueItems become placeholders that number_grammar, string_grammar
    and unique_grammar swap for exact rules once xgrammar has written the rest of the grammar
    (schema_ebnf). ``defaults`` (a request's schema_defaults) bound the strings and arrays the schema
    leaves unbounded (with_default_bounds).
    """
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise StructuredOutputError(f"schema at {where} must be an object or a boolean")
    for key in schema:
        if key not in _KEYWORDS:
            raise StructuredOutputError(
                f"schema keyword '{key}' at {where} is not supported by the grammar engine "
                f"({SUPPORT['engine']}); remove it or use a supported keyword"
            )
    out = dict(schema)
    fmt = schema.get("format")
    if fmt in _FORMAT_PATTERNS:
        if "pattern" in schema:
            raise StructuredOutputError(f"schema keyword 'pattern' at {where}: cannot be combined with format {fmt!r}")
        del out["format"]
        out["pattern"] = _FORMAT_PATTERNS[fmt]
    elif fmt is not None and fmt not in _FORMATS:
        raise StructuredOutputError(
            f"schema keyword 'format' at {where}: format {fmt!r} is not supported "
            f"(supported: {', '.join(sorted(_FORMATS | set(_FORMAT_PATTERNS)))})"
        )
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
        raise StructuredOutputError(f"schema keyword '$ref' at {where}: only local references (#/...) are supported")
    if len(schema.get("allOf") or []) > 1:
        raise StructuredOutputError(f"schema keyword 'allOf' at {where}: only one subschema is supported")
    _check_contradictions(schema, where)
    for key in schema.get("patternProperties") or {}:
        try:
            string_grammar.check_plain_pattern(key)
        except string_grammar.PatternError as err:
            raise StructuredOutputError(f"schema keyword 'patternProperties' at {where}: pattern '{key}': {err}") from None
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {k: _check(v, f"{where}/{key}/{k}", defaults) for k, v in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [_check(v, f"{where}/{key}/{i}", defaults) for i, v in enumerate(schema[key])]
    for key in _SCHEMA_ONE:
        if key in schema:
            out[key] = _check(schema[key], f"{where}/{key}", defaults)
    out = with_default_bounds(out, defaults or {})
    if any(k in schema for k in _NUMERIC):
        out = _exact_number(out, where)
    if "pattern" in schema or any(k in out for k in _LENGTHS):  # a format's own pattern alone: xgrammar's is exact
        out = _exact_string(out, where, fmt if fmt in _FORMAT_PATTERNS else None)
    if "uniqueItems" in schema:
        out = _unique_items(out, where)
    return out


def with_default_bounds(schema: dict, defaults: dict) -> dict:
    """``schema`` with a request's schema_defaults filled in: maxLength on a string with no maxLength,
    pattern, format or listed values; maxItems on an array with no maxItems or prefixItems. Counted
    above the schema's own minimum (a minimum of the wrong type is refused later by name)."""
    types = _types(schema)

    def above_minimum(key: str, bound: int) -> int:
        low = schema.get(key, 0)
        return low + bound if isinstance(low, int) and not isinstance(low, bool) and low > 0 else bound

    if (
        defaults.get("maxLength")
        and "string" in types
        and not any(k in schema for k in ("maxLength", "pattern", "format", "enum", "const"))
    ):
        schema = {**schema, "maxLength": above_minimum("minLength", defaults["maxLength"])}
    if defaults.get("maxItems") and "array" in types and not any(k in schema for k in ("maxItems", "prefixItems")):
        schema = {**schema, "maxItems": above_minimum("minItems", defaults["maxItems"])}
    return schema


def _types(schema: dict) -> list:
    types = schema.get("type")
    return [types] if isinstance(types, str) else types if isinstance(types, list) else []


def _as_placeholder(schema: dict, key: str, own: tuple, kinds: list) -> dict:
    """``schema`` with its ``own`` keywords replaced by the placeholder ``key`` (a const), as anyOf the
    placeholder and its other types when it has types not in ``kinds``."""
    rest = {k: v for k, v in schema.items() if k not in own and k != "type"}
    others = [t for t in _types(schema) if t not in kinds]
    if not others:
        return {**rest, "const": key}
    # the other types' keywords go in their branch: xgrammar ignores keywords beside anyOf
    top = {k: v for k, v in rest.items() if k in ("$defs", "definitions")}
    other = {k: v for k, v in rest.items() if k not in top}
    return {**top, "anyOf": [{"const": key}, {**other, "type": others if len(others) > 1 else others[0]}]}


def _no_values_list(schema: dict, keyword: str, where: str) -> None:
    for key in ("enum", "const"):
        if key in schema:
            raise StructuredOutputError(
                f"schema keyword '{keyword}' at {where} cannot be combined with '{key}': list only the allowed values"
            )


def _check_whole_numbers(schema: dict, keys: tuple, where: str) -> None:
    for key in keys:
        value = schema.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StructuredOutputError(f"schema keyword '{key}' at {where} must be a whole number of at least 0")


def _check_contradictions(schema: dict, where: str) -> None:
    """Refuse, by keyword, a schema no value satisfies: an empty enum, a minimum count above its maximum,
    or a required property that additionalProperties: false forbids."""
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        raise StructuredOutputError(f"schema keyword 'enum' at {where} must list at least one value")
    for low, high in (("minItems", "maxItems"), ("minProperties", "maxProperties")):
        _check_whole_numbers(schema, (low, high), where)
        if high in schema and schema.get(low, 0) > schema[high]:
            raise StructuredOutputError(
                f"schema keywords '{low}', '{high}' at {where}: {low} {schema[low]} is above {high} {schema[high]}"
            )
    if schema.get("additionalProperties") is False and "patternProperties" not in schema:
        missing = [n for n in schema.get("required") or [] if n not in (schema.get("properties") or {})]
        if missing:
            raise StructuredOutputError(
                f"schema keyword 'required' at {where}: '{missing[0]}' is required but not "
                "in properties, and additionalProperties is false"
            )


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer beyond any double
        return False


def _exact_number(schema: dict, where: str) -> dict:
    """A number or integer with bounds or multipleOf as a placeholder for number_grammar (a nullable
    one, or one of several types, as anyOf the placeholder and the other types)."""
    present = [k for k in _NUMERIC if k in schema]
    for key in present:
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            raise StructuredOutputError(f"schema keyword '{key}' at {where} must be a finite number")
    numeric = [t for t in _types(schema) if t in ("number", "integer")]
    if not numeric:
        raise StructuredOutputError(f'schema keyword \'{present[0]}\' at {where} needs "type": "number" or "integer"')
    _no_values_list(schema, present[0], where)
    key = number_grammar.placeholder("number" if "number" in numeric else "integer", schema)
    try:
        if "multipleOf" in schema:
            number_grammar.multiple_of(number_grammar.decimal_of(schema["multipleOf"]).text())
    except number_grammar.NumberRangeError as err:
        raise StructuredOutputError(f"schema keyword 'multipleOf' at {where}: {err}") from None
    try:
        number_grammar.number_rules(key, "n")
    except number_grammar.NumberRangeError as err:
        raise StructuredOutputError(f"schema keywords {', '.join(repr(k) for k in present)} at {where}: {err}") from None
    return _as_placeholder(schema, key, _NUMERIC, ["number", "integer"])


def _exact_string(schema: dict, where: str, fmt: str | None) -> dict:
    """A string with a pattern (its own, or its format's) or lengths as a placeholder for string_grammar."""
    _check_whole_numbers(schema, _LENGTHS, where)
    types = _types(schema)
    if types and "string" not in types:
        return schema  # pattern and lengths apply to strings only
    named = [k for k in ("pattern", *_LENGTHS) if k in schema]
    if fmt:
        named = ["format", *(k for k in named if k != "pattern")]
    if "format" in schema:
        raise StructuredOutputError(
            f"schema keyword '{named[-1]}' at {where} cannot be combined with format '{schema['format']}'"
        )
    _no_values_list(schema, named[0], where)
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    if hi is not None and lo > hi:
        raise StructuredOutputError(
            f"schema keywords 'minLength', 'maxLength' at {where}: minLength {lo} is above maxLength {hi}"
        )
    pattern = schema.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise StructuredOutputError(f"schema keyword 'pattern' at {where} must be a string")
    try:
        key = string_grammar.placeholder(pattern, lo, hi)
        string_grammar.string_rules(key, "s")
    except string_grammar.PatternError as err:
        raise StructuredOutputError(
            f"schema keyword{'s' if len(named) > 1 else ''} {', '.join(repr(k) for k in named)} at {where}: {err}"
        ) from None
    return _as_placeholder(schema, key, ("pattern", *_LENGTHS), ["string"])


def _unique_items(schema: dict, where: str) -> dict:
    """An array with uniqueItems as a placeholder for unique_grammar (uniqueItems false: dropped)."""
    if not isinstance(schema["uniqueItems"], bool):
        raise StructuredOutputError(f"schema keyword 'uniqueItems' at {where} must be true or false")
    if not schema["uniqueItems"]:
        return {k: v for k, v in schema.items() if k != "uniqueItems"}
    types = _types(schema)
    if types and "array" not in types:
        return schema
    _no_values_list(schema, "uniqueItems", where)
    try:
        if "prefixItems" in schema:
            raise unique_grammar.UniqueItemsError("uniqueItems cannot be combined with prefixItems")
        key = unique_grammar.placeholder(
            unique_grammar.item_values(schema.get("items")), schema.get("minItems", 0), schema.get("maxItems")
        )
        unique_grammar.unique_rules(key, "u")
    except unique_grammar.UniqueItemsError as err:
        raise StructuredOutputError(f"schema keyword 'uniqueItems' at {where}: {err}") from None
    return _as_placeholder(schema, key, ("items", "uniqueItems", "minItems", "maxItems"), ["array"])


_RULES = {
    "number": number_grammar.number_rules,
    "integer": number_grammar.number_rules,
    "string": string_grammar.string_rules,
    "unique": unique_grammar.unique_rules,
}


def with_exact_rules(ebnf: str) -> str:
    """xgrammar's printed grammar with every placeholder replaced by its exact rules."""
    names: dict[str, tuple[str, str]] = {}

    def swap(m: re.Match) -> str:
        kind = "number" if m[2] == "integer" else m[2]
        if m[1] not in names:
            names[m[1]] = (m[2], f"lantern_{kind}_{sum(n.startswith(f'lantern_{kind}_') for _, n in names.values())}")
        return names[m[1]][1] + "_0"

    text = PLACEHOLDER_IN_EBNF.sub(swap, ebnf)
    if not names:
        return ebnf
    rules = [rule for key, (kind, name) in names.items() for rule in _RULES[kind](key, name)]
    return text.rstrip("\n") + "\n" + "\n".join(rules) + "\n"


def schema_ebnf(source: str) -> str:
    """The EBNF grammar of a checked schema (JSON text) in JSON_LAYOUT, placeholders swapped for their
    exact rules. The twin of structured.ts's ``schemaEbnf``."""
    import xgrammar

    return with_exact_rules(str(xgrammar.Grammar.from_json_schema(source, **JSON_LAYOUT)))


# ---- requests -> grammar specs ------------------------------------------------------------------


@dataclass(frozen=True)
class GrammarSpec:
    """What xgrammar compiles: kind is "json_schema" (a JSON text), "ebnf", or "structural_tag" (JSON)."""

    kind: str
    source: str
    warnings: tuple[str, ...] = field(default=(), compare=False)  # what the schemas' rewrite ignored


def grammar_size(schema) -> int:
    """The size compile_limits bounds, read from a checked schema, the same in both runtimes (the twin of
    structured.ts's grammarSize): one per JSON object in it (each subschema, each map of them), and for an
    object with minProperties or maxProperties, whose grammar xgrammar writes with a count of properties
    written so far, n(n+1)/2 more for its n properties. xgrammar's rules, compile time and memory grow
    with it (tracked by ci/bench_structured.py --jsonschemabench)."""
    if isinstance(schema, list):
        return sum(grammar_size(v) for v in schema)
    if not isinstance(schema, dict):
        return 0
    n = len(schema["properties"]) if isinstance(schema.get("properties"), dict) else 0
    counted = n * (n + 1) // 2 if ("minProperties" in schema or "maxProperties" in schema) else 0
    return 1 + counted + sum(grammar_size(v) for v in schema.values())


def check_size(size: int, limits: dict = COMPILE_LIMITS) -> None:
    if size > limits["size"]:
        raise StructuredOutputError(
            f"the schema's grammar has size {size}, over the limit of {limits['size']}: bound or simplify it "
            "(fewer subschemas or alternatives, no minProperties or maxProperties over many properties)"
        )


def _schema_spec(schema, where: str, defaults: dict | None) -> GrammarSpec:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as err:
            raise StructuredOutputError(f"{where} is not valid JSON: {err}") from None
    warnings: list[str] = []
    checked = check_schema(schema, defaults=defaults, warnings=warnings)
    check_size(grammar_size(checked))
    return GrammarSpec("json_schema", json.dumps(checked), tuple(warnings))  # in the schema's order


def response_format_spec(fmt: dict | None, defaults: dict | None = None) -> GrammarSpec | None:
    """The grammar for a `response_format` (OpenAI's, WebLLM's, and Lantern's grammar/regex forms)."""
    if not fmt or fmt.get("type", "text") == "text":
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        schema = fmt.get("schema")  # WebLLM passes a schema as a JSON string here
        return _schema_spec(schema if schema is not None else {"type": "object"}, "response_format.schema", defaults)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise StructuredOutputError("response_format.json_schema must be {name, schema, strict}")
        return _schema_spec(spec["schema"], "response_format.json_schema.schema", defaults)
    if kind == "grammar":
        if not isinstance(fmt.get("grammar"), str) or not fmt["grammar"].strip():
            raise StructuredOutputError("response_format.grammar must be an EBNF string with a `root` rule")
        check_size(fmt["grammar"].count("::="))  # a grammar's own rules
        return GrammarSpec("ebnf", fmt["grammar"])
    if kind == "regex":
        if not isinstance(fmt.get("pattern"), str) or not fmt["pattern"]:
            raise StructuredOutputError("response_format.pattern must be a regular expression string")
        return GrammarSpec(
            "structural_tag", json.dumps({"type": "structural_tag", "format": {"type": "regex", "pattern": fmt["pattern"]}})
        )
    raise StructuredOutputError(f"response_format.type {kind!r} is not one of text, json_object, json_schema, grammar, regex")


def _tool_tag(fn: dict, defaults: dict | None, warnings: list) -> dict:
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "tag",
        "begin": f'{TOOL_OPEN}{{"name": {json.dumps(fn["name"])}, "arguments": ',
        "content": {
            "type": "json_schema",
            "json_schema": check_schema(params, f"#/tools/{fn['name']}/parameters", defaults, warnings),
        },
        "end": "}" + TOOL_CLOSE,
    }


def calls_tools(tools: list[dict], choice) -> bool:
    """Whether a request may produce tool calls."""
    return bool(tools) and choice != "none"


def tool_spec(tools: list[dict], choice, parallel: bool, defaults: dict | None = None) -> GrammarSpec | None:
    """The grammar for tool calls: free text with calls (auto), calls only (required), or one function."""
    if not calls_tools(tools, choice):
        return None
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    warnings: list[str] = []
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in by_name:
            raise StructuredOutputError(f"tool_choice names the function {name!r}, which is not in tools ({', '.join(by_name)})")
        fmt = _tool_tag(by_name[name], defaults, warnings)
    else:
        tags = [_tool_tag(fn, defaults, warnings) for fn in by_name.values()]
        if choice == "required":
            fmt = {
                "type": "tags_with_separator",
                "tags": tags,
                "separator": "\n",
                "at_least_one": True,
                "stop_after_first": not parallel,
            }
        else:
            fmt = {
                "type": "triggered_tags",
                "triggers": [TOOL_OPEN],
                "tags": tags,
                "at_least_one": False,
                "stop_after_first": not parallel,
            }
    check_size(grammar_size(fmt))
    return GrammarSpec("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}), tuple(warnings))


def request_spec(
    response_format: dict | None, tools: list[dict], tool_choice, parallel: bool, defaults: dict | None = None
) -> GrammarSpec | None:
    """The one grammar a chat request asks for: from its tools, or from its response_format. ``defaults``:
    the request's schema_defaults (bounds for unbounded strings and arrays); None: no bounds."""
    if tool_choice not in (None, "none", "auto") and not tools:
        raise StructuredOutputError("tool_choice needs tools")
    calls = tool_spec(tools, tool_choice, parallel, defaults)
    fmt = response_format_spec(response_format, defaults)
    if calls and fmt:
        raise StructuredOutputError(
            'response_format cannot be combined with tools in one request; use tool_choice: "none" or drop response_format'
        )
    return calls or fmt


def tight_structural_tag(source: str) -> str:
    """A structural tag with each ``json_schema`` content replaced by that schema's grammar in
    JSON_LAYOUT. xgrammar's structural tags put free whitespace inside JSON, where a small model can
    loop until max_tokens (a tool call's arguments did, 64 of 64 tokens); response_format's JSON has
    none. The twin of structured.ts's ``tightStructuralTag``."""

    def visit(node):
        if isinstance(node, list):
            return [visit(v) for v in node]
        if not isinstance(node, dict):
            return node
        if node.get("type") == "json_schema" and "json_schema" in node:
            return {"type": "grammar", "grammar": schema_ebnf(json.dumps(node["json_schema"]))}
        return {k: visit(v) for k, v in node.items()}

    return json.dumps(visit(json.loads(source)))


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


# ---- xgrammar -----------------------------------------------------------------------------------


def _engine_message(err: Exception) -> str:
    """xgrammar's error without its C++ source location."""
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(err).strip()).splitlines()[0]


class GrammarCompileFault(LanternError):
    """A compile past the safety net in seconds: the machine's fault, not the schema's (HTTP 503)."""


def compiled_text(spec: GrammarSpec) -> str:
    """What xgrammar compiles for a spec: a json_schema's EBNF (placeholders swapped), an ebnf spec's own
    text, a structural tag's tight form (the twin of structured.ts's compiledText)."""
    if spec.kind == "json_schema":
        return schema_ebnf(spec.source)
    return spec.source if spec.kind == "ebnf" else tight_structural_tag(spec.source)


class GrammarCompiler:
    """One per model: the vocabulary for xgrammar and a cache of compiled grammars by spec.

    What may be compiled was decided with the spec (grammar_size, the same on every machine and in the
    browser); a compile that takes longer than ``limits["seconds"]`` (a safety net far above that) answers
    503 and keeps its result for a retry. The cache holds at most ``limits["cache_megabytes"]`` of compiled
    grammars, least recently used out first."""

    def __init__(
        self, tokenizer_json: dict, token_postproc: str, vocab_size: int, stop_ids: list[int], limits: dict = COMPILE_LIMITS
    ):
        import xgrammar  # imported here: it pulls in torch, which only structured requests need

        self._xgr = xgrammar
        vocab = [""] * vocab_size
        for token, i in tokenizer_json["model"]["vocab"].items():
            vocab[i] = token
        for t in tokenizer_json.get("added_tokens", []):
            vocab[t["id"]] = t["content"]
        vocab_type = {"byte_level": xgrammar.VocabType.BYTE_LEVEL, "byte_fallback": xgrammar.VocabType.BYTE_FALLBACK}.get(
            token_postproc, xgrammar.VocabType.RAW
        )
        info = xgrammar.TokenizerInfo(vocab, vocab_type, vocab_size=vocab_size, stop_token_ids=sorted(stop_ids))
        self._compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)  # the cache below bounds memory
        self._cache: OrderedDict[GrammarSpec, xgrammar.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.limits = limits
        self.vocab_size = vocab_size
        self.hits = 0

    def _cached(self, spec: GrammarSpec):
        with self._lock:
            if spec not in self._cache:
                return None
            self.hits += 1
            self._cache.move_to_end(spec)
            return self._cache[spec]

    def _keep(self, spec: GrammarSpec, compiled) -> None:
        with self._lock:
            self._cache[spec] = compiled
            budget = self.limits["cache_megabytes"] * 2**20
            while len(self._cache) > 1 and sum(c.memory_size_bytes for c in self._cache.values()) > budget:
                self._cache.popitem(last=False)

    def compile(self, spec: GrammarSpec):
        hit = self._cached(spec)
        if hit is not None:
            return hit
        what = {"json_schema": "JSON schema", "ebnf": "EBNF grammar"}.get(spec.kind, "grammar")
        start = time.perf_counter()
        try:
            text = compiled_text(spec)
            if spec.kind == "structural_tag":
                compiled = self._compiler.compile_structural_tag(text)
            else:
                compiled = self._compiler.compile_grammar(text)
        except Exception as err:  # noqa: BLE001 (xgrammar raises RuntimeError and its own types alike)
            raise StructuredOutputError(f"invalid {what}: {_engine_message(err)}") from None
        seconds = time.perf_counter() - start
        self._keep(spec, compiled)
        if seconds > self.limits["seconds"]:
            raise GrammarCompileFault(
                f"compiling the grammar took {seconds:.1f} s, over the server's limit of "
                f"{self.limits['seconds']} s (the machine is busy); it is kept: retry"
            )
        return compiled

    def matcher(self, compiled) -> "TokenMask":
        return TokenMask(self._xgr, compiled, self.vocab_size)


class TokenMask:
    """The grammar state of one generation: which tokens may come next."""

    def __init__(self, xgr, compiled, vocab_size: int):
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._shifts = np.arange(32, dtype=np.uint32)
        self.vocab_size = vocab_size

    def allowed(self) -> np.ndarray:
        """A boolean array over the vocabulary: True where the grammar allows the token."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        words = self._bitmask.numpy()[0].view(np.uint32)
        bits = (words[:, None] >> self._shifts) & 1
        return bits.reshape(-1)[: self.vocab_size].astype(bool)

    def rollback(self, tokens: int) -> None:
        """Undo the last ``tokens`` accepted tokens."""
        self._matcher.rollback(tokens)

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise LanternError(f"internal: the grammar rejected token {token} it allowed")
