"""Structured output and tool calls on the Python side (lantern serve), and its parity with the browser's.

The schema checks and request-to-grammar rules exist once, in TypeScript (webruntime/src/structured.ts), which
the server runs in V8; the parity test runs the browser's bundle under Node on the same requests and compares
every grammar spec and error (the two bridges), xgrammar's own EBNF for each schema (the two xgrammar builds),
and the tool-call text format (still one copy per language: it runs on every streamed delta).
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile

import jsonschema
import pytest
import xgrammar
from xgrammar.testing import _get_matcher_from_grammar, _is_grammar_accept_string

from browser import lantern_server, repo_root, wait_until_ready
from structured_cases import (
    ADD,
    ANNOTATED,
    ANNOTATED_WARNINGS,
    BAD_REQUESTS,
    MESSAGES,
    SCHEMAS,
    SEEDS,
    STRICT_FORMATS,
    TOOLS,
    WEATHER,
    closed_json,
    cpu_runs,
    random_strict_schema,
    request,
)

from lantern.server.grammars import JSON_LAYOUT, schema_ebnf, tight_structural_tag
from lantern.server.structured import StructuredOutputError, check_schema, parse_tool_calls, request_spec

WEBRUNTIME = repo_root() / "webruntime"


def python_spec(req: dict):
    spec = request_spec(
        req.get("response_format"),
        req.get("tools") or [],
        req.get("tool_choice"),
        req.get("parallel_tool_calls", True),
        req.get("schema_defaults"),
    )
    return spec and {"kind": spec.kind, "source": spec.source}


# ---- schema checks (no model) --------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema, keyword",
    [
        ({"type": "array", "uniqueItems": True, "minItems": 2}, "uniqueItems"),  # items that cannot be listed
        ({"type": "array", "items": {"type": "object"}, "uniqueItems": True, "minItems": 2}, "uniqueItems"),
        ({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0.01}}}, "multipleOf"),  # not exact in doubles
        ({"enum": []}, "enum"),
        ({"type": "string", "pattern": "^a$", "minLength": 2}, "minLength"),  # no string matches both
        ({"type": "string", "pattern": "x^y"}, "pattern"),
        ({"type": "string", "minLength": 4, "maxLength": 3}, "maxLength"),
        ({"type": "array", "minItems": 4, "maxItems": 3}, "minItems"),
        ({"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False}, "required"),
        ({"type": "string", "format": "uuid", "maxLength": 8}, "maxLength"),
        ({"type": "integer", "not": {"const": 3}}, "not"),
        ({"type": "string", "format": "uri-reference", "pattern": "^a"}, "pattern"),  # a format is a pattern already
        ({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}, "pattern"),  # two patterns: not merged
        ({"type": "object", "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, "if"),
        ({"type": "array", "contains": {"type": "integer"}}, "contains"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "$ref"),  # a $ref to nowhere
        ({"$ref": "https://example.com/s.json"}, "$ref"),
        ({"type": "number", "minimum": 10, "maximum": 1}, "minimum"),  # contradictory bounds
        ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "exclusiveMinimum"),  # no integer between
        ({"minimum": 1}, "minimum"),  # a bound needs a numeric type
        ({"type": "number", "maximum": "10"}, "maximum"),
        ({"type": "integer", "maximum": 10, "enum": [1, 20]}, "maximum"),
    ],
)
def test_schema_features_xgrammar_would_ignore_are_rejected_by_name(schema, keyword):
    with pytest.raises(StructuredOutputError, match=re.escape(f"'{keyword}'")):
        check_schema(schema)


def test_properties_come_in_the_schema_s_order():
    """As OpenAI's strict mode writes them: a model that reasons before it answers keeps that order."""
    schema = {
        "type": "object",
        "properties": {"reasoning": {"type": "string"}, "answer": {"type": "integer"}},
        "required": ["reasoning", "answer"],
        "additionalProperties": False,
    }
    spec = request_spec({"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}, [], None, True)
    grammar = xgrammar.Grammar.from_json_schema(spec.source, **JSON_LAYOUT)
    assert _is_grammar_accept_string(grammar, '{"reasoning": "x", "answer": 1}')
    assert not _is_grammar_accept_string(grammar, '{"answer": 1, "reasoning": "x"}')


def test_number_ranges_are_enforced_exactly_inside_a_schema():
    # xgrammar 0.1.27 turns 18..120 into digit classes that also accept 121..129, and 0 < x < 1 into any number
    raw = xgrammar.Grammar.from_json_schema(json.dumps({"type": "integer", "minimum": 18, "maximum": 120}))
    assert _is_grammar_accept_string(raw, "125")
    schema = {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "exclusiveMinimum": 17, "maximum": 120},
            "p": {"type": ["number", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        },
        "required": ["age", "p"],
        "additionalProperties": False,
    }
    grammar = xgrammar.Grammar.from_ebnf(schema_ebnf(json.dumps(check_schema(schema))))
    for value in range(-5, 140):
        assert _is_grammar_accept_string(grammar, f'{{"age": {value}, "p": null}}') == (18 <= value <= 120), value
    for p in ("0", "1", "0.5", "0.999", "1.5", "-0.5", "null"):
        assert _is_grammar_accept_string(grammar, f'{{"age": 30, "p": {p}}}') == (p == "null" or 0 < float(p) < 1), p


TIGHT_SAMPLES = [
    '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 100}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": { "a": 2, "b": 3}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"a":2, "b": 3}}</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "' + "x" * 21 + '", "unit": "celsius"}}</tool_call>',
    'Sure. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>',
    "no calls here",
    "ab@cd.com",  # the regex response_format, also a structural tag
]


def _without_grammars(node):
    """A structural tag with each embedded grammar's text left out (its place and kind kept)."""
    if isinstance(node, list):
        return [_without_grammars(v) for v in node]
    if isinstance(node, dict):
        return {k: "<grammar>" if k == "grammar" else _without_grammars(v) for k, v in node.items()}
    return node


def test_typescript_and_python_build_the_same_grammars():
    requests = [request(name, 1) for name in SCHEMAS]
    requests += [{"messages": [], **bad} for bad, _ in BAD_REQUESTS]
    requests += [
        {"messages": [], "tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": parallel}
        for choice in ("auto", "required", "none", {"type": "function", "function": {"name": "add"}})
        for parallel in (True, False)
    ]
    requests += [
        {**request(name, 1), "schema_defaults": bounds}
        for name in ("flat_required", "array_of_objects")
        for bounds in ({"maxLength": 5, "maxItems": 1}, {"maxLength": 0, "maxItems": 0}, {"maxLength": 300})
    ]
    requests += [{"messages": [], "tools": TOOLS, "tool_choice": "required", "schema_defaults": {"maxLength": 7}}]
    requests += [
        {"messages": [], "response_format": {"type": "regex", "pattern": "[a-z]+@[a-z]+\\.com"}},
        {"messages": [], "response_format": {"type": "grammar", "grammar": 'root ::= "yes" | "no"'}},
        {"messages": [], "response_format": {"type": "json_object"}},
        {"messages": [], "response_format": {"type": "json_object", "schema": json.dumps(SCHEMAS["enum"])}},
    ]
    texts = [
        'Sure.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n<tool_call>{"name": "ad',
        "no calls here",
    ]
    payload = {"requests": requests, "schemas": list(SCHEMAS.values()), "texts": texts}
    out = run_typescript("structured_parity.ts", payload)

    for req, ts in zip(requests, out["specs"]):
        try:
            py = {"spec": python_spec(req)}
        except StructuredOutputError as err:
            py = {"error": f"InvalidRequestError: {err}"}
        if "error" in py or "error" in ts:
            # the same message, but for the JSON parser's own wording of where it failed
            strip = lambda r: {k: re.sub(r"not valid JSON: .*", "not valid JSON", v) for k, v in r.items()}  # noqa: E731
            assert strip(py) == strip(ts), req
        elif py["spec"] is None:
            assert ts["spec"] is None, req
        else:
            assert ts["spec"]["kind"] == py["spec"]["kind"], req
            # the same JSON with its keys in the same order (xgrammar writes properties in schema order)
            parse = (lambda t: json.dumps(json.loads(t))) if py["spec"]["kind"] != "ebnf" else str  # noqa: E731
            assert parse(ts["spec"]["source"]) == parse(py["spec"]["source"]), req
    # Structural tags are compiled with their JSON tightened (no free whitespace). The two xgrammar builds
    # print a bounded repeat differently (maxLength), so the grammars are held equal by what they accept.
    tightened = [(req, tight) for req, ts, tight in zip(requests, out["specs"], out["tight"]) if tight is not None]
    assert len(tightened) >= 6
    for req, tight in tightened:
        ts_tag, py_tag = json.loads(tight), json.loads(tight_structural_tag(python_spec(req)["source"]))
        assert _without_grammars(ts_tag) == _without_grammars(py_tag), req
        ts_grammar, py_grammar = (xgrammar.Grammar.from_structural_tag(json.dumps(t)) for t in (ts_tag, py_tag))
        accepted = [_is_grammar_accept_string(py_grammar, text) for text in TIGHT_SAMPLES]
        assert [_is_grammar_accept_string(ts_grammar, text) for text in TIGHT_SAMPLES] == accepted, req
        assert any(accepted) and not accepted[1] and not accepted[2], req  # 1, 2: whitespace off the layout
    for (name, schema), web_ebnf, web_numbers in zip(SCHEMAS.items(), out["ebnf"], out["numbers"]):
        source = json.dumps(check_schema(schema))
        assert web_ebnf == xgrammar.testing._json_schema_to_ebnf(source, **JSON_LAYOUT), name
        assert web_numbers == [line for line in schema_ebnf(source).splitlines() if line.startswith("lantern_")]
    for text, ts in zip(texts, out["calls"]):
        content, calls = parse_tool_calls(text)
        assert ts == {"content": content, "calls": [c["function"] for c in calls]}, text
    # the browser keeps what it compiled (a slow compile is only logged: the server's time limit is for its load)
    assert out["limit"] == ["compiled", "compiled"] and out["entries"] == 1 and out["hits"] == 1


def test_unbounded_strings_and_arrays_get_the_request_s_default_bounds():
    """schema_defaults (request_rules.json: maxLength 256, maxItems 64 unless the request says otherwise)
    bound a free string and an array with no maximum, counted above a minimum; a pattern keeps its
    own bounds; 0 turns a bound off."""
    from lantern.server.protocol import ChatCompletionRequest

    schema = {
        "type": "object",
        "properties": {
            "s": {"type": ["string", "null"]},
            "p": {"type": "string", "pattern": "^a+$"},
            "a": {"type": "array", "items": {"type": "integer"}},
            "m": {"type": "string", "minLength": 300},
        },
        "required": ["s", "p", "a", "m"],
        "additionalProperties": False,
    }

    def accepts(defaults: dict | None):
        req = ChatCompletionRequest(
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
            **({"schema_defaults": defaults} if defaults is not None else {}),
        )
        assert req.schema_defaults.model_dump() == {"maxLength": 256, "maxItems": 64, "dryMultiplier": 0.8, **(defaults or {})}
        spec = request_spec(req.response_format.model_dump(exclude_none=True), [], None, True, req.schema_defaults.model_dump())
        return lambda s="x", p="a", a=(1,), m="m" * 300: _is_grammar_accept_string(  # noqa: E731
            xgrammar.Grammar.from_ebnf(schema_ebnf(spec.source)),
            json.dumps({"s": s, "p": p, "a": list(a), "m": m}, separators=(", ", ": ")),
        )

    table = accepts(None)
    assert table(s="x" * 256) and not table(s="x" * 257) and table(s=None)
    assert table(a=range(64)) and not table(a=range(65))
    assert table(p="a" * 400) and table(m="m" * 556) and not table(m="m" * 557) and not table(m="m" * 299)
    tight = accepts({"maxLength": 4, "maxItems": 2})
    assert tight(s="x" * 4) and not tight(s="x" * 5) and not tight(a=(1, 2, 3)) and not tight(m="m" * 305)
    off = accepts({"maxLength": 0, "maxItems": 0})
    assert off(s="x" * 1000) and off(a=range(100))


def test_the_compile_limit_is_the_schema_s_size_and_the_time_limit_a_server_fault():
    """A schema whose grammar is over compile_limits' size is refused when the request is read (the same
    count on every machine; the browser's is held equal in test_browser_and_server_decide_alike...); a
    compile past the seconds safety net is a 503-type fault whose grammar is kept; the cache keeps at most
    cache_megabytes of grammars, least recently used out first."""
    from lantern.server.grammars import GrammarCompileFault, GrammarCompiler
    from lantern.server.structured import COMPILE_LIMITS, GrammarSpec, grammar_size

    assert COMPILE_LIMITS == {"size": 2000, "seconds": 30, "cache_megabytes": 1024}
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(70)}, "minProperties": 1}
    assert grammar_size(check_schema(wide)) > 2000  # counted: 70 * 71 / 2 beside the 70 subschemas
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": wide}}
    with pytest.raises(StructuredOutputError, match=r"grammar has size \d+, over the limit of 2000"):
        request_spec(fmt, [], None, True)
    assert request_spec({**fmt, "json_schema": {"name": "w", "schema": {**wide, "required": ["p0"]}}}, [], None, True)
    vocab = {c: i for i, c in enumerate('abcdefghij{}[]":, 0123456789')}
    specs = [GrammarSpec("json_schema", json.dumps(check_schema({"type": "string", "maxLength": n}))) for n in (3, 4)]
    slow = GrammarCompiler({"model": {"vocab": vocab}}, "raw", 32, [31], limits={**COMPILE_LIMITS, "seconds": 0})
    with pytest.raises(GrammarCompileFault, match=r"took \d+\.\d s, over the server's limit of 0 s"):
        slow.compile(specs[0])
    assert slow.compile(specs[0]) and slow.hits == 1  # kept: the retry is a hit
    small = GrammarCompiler({"model": {"vocab": vocab}}, "raw", 32, [31], limits={**COMPILE_LIMITS, "cache_megabytes": 0})
    small.compile(specs[0])
    small.compile(specs[1])
    small.compile(specs[0])
    assert small.hits == 0  # the budget holds one grammar: the first was dropped for the second


def run_typescript(entry: str, payload: dict) -> dict:
    """Bundle tests/node/``entry`` with esbuild (the runtime's inlined JSON files as in its build:
    webruntime/defines.mjs) and run it under Node with ``payload`` on stdin; returns what it prints (JSON)."""
    bundle = subprocess.run(
        [
            "node",
            "--input-type=module",
            "-e",
            "import * as esbuild from 'esbuild'; import { defines } from './defines.mjs';"
            f"const r = await esbuild.build({{ entryPoints: ['../tests/node/{entry}'], bundle: true,"
            " format: 'esm', platform: 'node', write: false, logLevel: 'error', nodePaths: [process.cwd() + '/node_modules'],"
            # tvmjs requires ws only in Node code paths the tests never take
            " external: ['ws'], banner: { js: 'globalThis.location = { href: \"file:///\" };' }, define: defines });"
            "process.stdout.write(r.outputFiles[0].text);",
        ],
        cwd=WEBRUNTIME,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".mjs", dir=WEBRUNTIME, delete=True) as f:
        f.write(bundle)
        f.flush()
        run = subprocess.run(["node", f.name], input=json.dumps(payload), cwd=WEBRUNTIME, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


# ---- the CPU engine (the server's) ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["tvm", "llamacpp"])
def test_every_schema_validates_for_two_seeds_on_the_cpu(smollm2_q4, report, engine):
    runs = cpu_runs(smollm2_q4.path, engine)
    for (name, seed), run in runs.items():
        assert run["finish"] == "stop", (name, seed, run["text"])
        jsonschema.validate(json.loads(run["text"]), SCHEMAS[name], format_checker=jsonschema.FormatChecker())
    tokens = sum(r["tokens"] for r in runs.values())
    report(
        f"structured (server, {engine} engine): {len(runs)} generations over {len(SCHEMAS)} schemas, 100% valid JSON; "
        f"{tokens / len(runs):.1f} tokens per answer"
    )


@pytest.mark.webgpu_build  # tiny_q4 is built with every target (shared with other tests); only its CPU library runs here
def test_random_strict_schemas_always_give_valid_json(tiny_q4, report):
    """50 random schemas over OpenAI's strict-mode keywords, two seeds each, on the server's tvm engine
    with the tiny random model (validity must not depend on the model): every answer that finishes
    validates with jsonschema and every listed format checked, and so does each answer that max_tokens cut
    and Lantern closed (closing.py); an answer cut where it could not be closed is counted apart, and is a
    prefix the grammar still allows (finish_reason "length")."""
    import random

    from lantern.server.engine import Generator, Stop
    from lantern.server.protocol import ChatCompletionRequest

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    assert set(STRICT_FORMATS) <= set(checker.checkers)
    rng = random.Random(16)
    generator = Generator(tiny_q4.path, "tvm")
    finished = closed = cut = 0
    try:
        prompt = generator.encode(generator.render_chat(MESSAGES))
        for k in range(50):
            schema = random_strict_schema(rng)
            for seed in SEEDS:
                req = ChatCompletionRequest(
                    messages=MESSAGES,
                    seed=seed,
                    temperature=1.0,
                    max_tokens=160,
                    response_format={"type": "json_schema", "json_schema": {"name": f"s{k}", "schema": schema, "strict": True}},
                )
                grammar = generator.compile_grammar(
                    spec := request_spec(
                        req.response_format.model_dump(exclude_none=True), [], None, True, req.schema_defaults.model_dump()
                    )
                )
                steps = []
                generator.generate(prompt, req, Stop(), steps.append, grammar=grammar)
                text, finish = "".join(s.delta for s in steps), steps[-1].finish
                if finish == "length" and not closed_json(text):  # still a prefix the grammar allows
                    matcher = _get_matcher_from_grammar(xgrammar.Grammar.from_ebnf(schema_ebnf(spec.source)))
                    assert matcher.accept_string(text), (schema, text)
                    cut += 1
                    continue
                assert finish in ("stop", "length"), (schema, text, finish)
                jsonschema.Draft202012Validator(schema, format_checker=checker).validate(json.loads(text))
                assert steps[-1].usage.completion_tokens <= 160
                finished += finish == "stop"
                closed += finish == "length"
    finally:
        generator.close()
    assert finished >= 40
    report(
        f"random strict schemas (tiny model, lantern serve's tvm engine): 50 schemas x 2 seeds: {finished} finished, "
        f"{closed} closed at max_tokens, 100% valid (jsonschema with format checks); {cut} cut by max_tokens "
        "(finish_reason length)"
    )


@pytest.mark.slow
def test_a_repeated_schema_is_compiled_once(smollm2_q4):
    from lantern.server.engine import Generator

    generator = Generator(smollm2_q4.path)
    spec = request_spec(request("ref_defs", 1)["response_format"], [], None, True)
    first = generator.compile_grammar(spec)
    hits = generator.grammars.hits
    assert generator.compile_grammar(spec) is first
    assert generator.grammars.hits == hits + 1
    generator.close()


@pytest.fixture(scope="module", params=["tvm", "llamacpp"])
def client(smollm2_q4, request):
    openai = pytest.importorskip("openai")
    with lantern_server([smollm2_q4.path], engine=request.param) as (base, _):
        wait_until_ready(base)
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def chat(client, text: str, **kw):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": text}], **{"max_tokens": 64, **kw}
    )


def assert_valid_call(call, tool: dict):
    assert call.type == "function" and call.function.name == tool["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.slow
def test_openai_client_gets_json_schema_output(client):
    schema = SCHEMAS["nested_object"]
    reply = chat(
        client,
        "Describe a user.",
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "user", "schema": schema}},
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    stream = chat(
        client,
        "Describe a user.",
        temperature=0,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "user", "schema": schema}},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == reply.choices[0].message.content
    # OpenAI's strict-mode keywords together: number bounds and multipleOf, formats, a pattern, nullable, anyOf,
    # bounded arrays, $defs and $ref
    strict = {
        "type": "object",
        "additionalProperties": False,
        "required": ["item", "price", "when", "note", "size", "sku", "qty", "colors"],
        "properties": {
            "item": {"$ref": "#/$defs/name"},
            "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 99.5},
            "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "qty": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
            "colors": {"type": "array", "items": {"enum": ["red", "blue"]}, "minItems": 1, "maxItems": 2},
            "when": {"type": "string", "format": "date"},
            "note": {"type": ["string", "null"], "maxLength": 12},
            "size": {"anyOf": [{"type": "integer", "minimum": 1, "exclusiveMaximum": 4}, {"enum": ["big"]}]},
        },
        "$defs": {"name": {"type": "string", "maxLength": 10}},
    }
    reply = chat(
        client,
        "Describe a product for sale.",
        temperature=0,
        max_tokens=256,
        response_format={"type": "json_schema", "json_schema": {"name": "product", "schema": strict, "strict": True}},
    )
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    jsonschema.Draft202012Validator(strict, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).validate(
        json.loads(reply.choices[0].message.content)
    )
    # Lantern's bound for free strings, set through the client's extra_body
    free = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": False}
    reply = chat(
        client,
        "Describe a user.",
        temperature=0,
        extra_body={"schema_defaults": {"maxLength": 3}},
        response_format={"type": "json_schema", "json_schema": {"name": "user", "schema": free}},
    )
    assert len(json.loads(reply.choices[0].message.content)["name"]) <= 3


@pytest.mark.slow
@pytest.mark.parametrize("client", ["llamacpp"], indirect=True)  # engine-independent: the fast engine
def test_a_constrained_answer_cut_by_max_tokens_ends_with_length(client):
    reply = chat(
        client,
        "Describe a user.",
        temperature=0,
        max_tokens=4,
        response_format={"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMAS["nested_object"]}},
    )
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.choices[0].message.content)  # 4 tokens cannot hold the object: unfinished, as OpenAI's


@pytest.mark.slow
@pytest.mark.parametrize("client", ["llamacpp"], indirect=True)  # engine-independent: the fast engine
def test_a_json_answer_cut_by_max_tokens_is_closed_within_it(client):
    """An answer that max_tokens cuts is rewound and closed (closing.py): valid JSON within the budget,
    finish_reason still "length". The stream holds back the tokens it may rewind and gives the same
    text. With logprobs (a closing token has none) it stays unfinished."""
    names = {
        "type": "object",
        "properties": {"names": {"type": "array", "items": {"type": "string"}}, "done": {"type": "boolean"}},
        "required": ["names", "done"],
        "additionalProperties": False,
    }
    kw = {
        "temperature": 0,
        "max_tokens": 20,  # SmolLM2's answer, {"names": ["NamE"], "done": false}, takes 23
        "response_format": {"type": "json_schema", "json_schema": {"name": "names", "schema": names}},
    }
    ask = "List fifty first names."
    reply = chat(client, ask, **kw)
    text = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens <= 20, reply
    answer = json.loads(text)
    jsonschema.validate(answer, names)
    assert answer["names"] and answer["names"][0]  # the model's own name kept, not only closing tokens
    chunks = list(chat(client, ask, stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    cut = chat(client, ask, logprobs=True, **kw)
    assert cut.usage.completion_tokens == 20
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.choices[0].message.content)


@pytest.mark.slow
@pytest.mark.parametrize("client", ["llamacpp"], indirect=True)  # engine-independent code: the fast engine (tvm: +90 s)
def test_openai_client_tool_calls_required_named_and_round_trip(client):
    for seed in (1, 2, 3):
        reply = chat(
            client, "What is the weather in Paris?", tools=TOOLS, tool_choice="required", seed=seed, parallel_tool_calls=False
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert_valid_call(call, {c["function"]["name"]: c for c in TOOLS}[call.function.name])

    reply = chat(
        client, "What is 2 plus 3?", tools=TOOLS, temperature=0, tool_choice={"type": "function", "function": {"name": "add"}}
    )
    [call] = reply.choices[0].message.tool_calls
    assert_valid_call(call, ADD)

    # the tool's result goes back in a `tool` message; the model answers in text
    a, b = (json.loads(call.function.arguments)[k] for k in "ab")
    messages = [
        {"role": "user", "content": "What is 2 plus 3?"},
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sum": a + b})},
    ]
    final = client.chat.completions.create(
        model=reply.model, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=32, temperature=0
    )
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls

    # streamed: the call arrives whole in the last chunk, no tag text leaks into content
    chunks = list(chat(client, "Weather in Oslo?", tools=[WEATHER], tool_choice="required", temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "<tool_call>" not in "".join(d.content or "" for d in deltas)
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert len(calls) >= 1 and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert_valid_call(calls[0], WEATHER)


@pytest.mark.slow
def test_a_real_world_schema_is_answered_and_what_was_ignored_is_said(client):
    """A draft-04 schema with a vendor keyword and an allOf: the answer validates (jsonschema reads it as
    draft-04) and lists what was ignored in lantern_warnings; a stream says it in its first chunk only."""
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": ANNOTATED}}
    done = chat(client, "Name a city and its population, as JSON.", response_format=fmt, temperature=0, max_tokens=96)
    assert done.lantern_warnings == ANNOTATED_WARNINGS
    assert done.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(done.choices[0].message.content), ANNOTATED)
    chunks = list(chat(client, "Name a city.", response_format=fmt, max_tokens=4, stream=True))
    assert chunks[0].lantern_warnings == ANNOTATED_WARNINGS
    assert not any(getattr(c, "lantern_warnings", None) for c in chunks[1:])


@pytest.mark.slow
@pytest.mark.parametrize("bad, word", BAD_REQUESTS, ids=[w for _, w in BAD_REQUESTS])
def test_openai_client_gets_400_for_bad_structured_requests(client, bad, word):
    import openai

    kwargs = dict(bad)
    with pytest.raises(openai.BadRequestError, match=word):
        chat(client, "Hi", **kwargs)


def test_the_server_runs_the_one_compiler_and_says_when_it_is_not_built(tmp_path):
    """lantern serve's schema rules are the TypeScript's, run in V8: a refusal comes back with its message and class;
    a checkout without the bundle (webruntime not built) is told how to build it, not a crash."""
    from lantern.errors import LanternError
    from lantern.server.schema_host import HOST, HostRefusal, SchemaHost

    with pytest.raises(HostRefusal, match="'multipleOf'") as err:
        HOST.call("checkSchema", {"type": "number", "multipleOf": 0.01}, "#", {})
    assert err.value.kind == "InvalidRequestError"
    with pytest.raises(LanternError, match=r"schema-host\.js\) is missing: run `npm ci && npm run build`"):
        SchemaHost(tmp_path / "schema-host.js").call("grammarSize", {})
