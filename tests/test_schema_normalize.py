"""Real-world schemas (webruntime/src/normalize.ts, which `lantern serve` runs in V8 and the browser bundles), no
model, seconds: each keyword group the rewrite reads (drafts, annotations and unknown keywords, allOf,
not, conditionals, $ref siblings, formats as bounds) lets through only JSON that jsonschema (Draft
2020-12, formats checked) and ajv both find valid, on random instances, and accepts its listed valid
examples; what was ignored is reported; bad schemas are refused by name; the browser's xgrammar build
writes the grammars the server's does, on these cases and on every JSONSchemaBench schema of
../shared/jsonschemabench when that folder is there (LANTERN_JSONSCHEMABENCH names another)."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import jsonschema
import pytest
import xgrammar
from xgrammar.testing import _is_grammar_accept_string

from browser import repo_root
from test_structured import run_typescript

sys.path.insert(0, str(repo_root() / "ci" / "bench"))
from jsonschemabench import in_schema_order, load  # noqa: E402

from lantern.server.grammars import schema_ebnf
from lantern.server.structured import StructuredOutputError, grammar_size, response_format_spec

LAYOUT = {"ensure_ascii": False, "separators": (", ", ": ")}

# (name, schema, valid examples the grammar must accept, each as Lantern writes it)
CASES = [
    (
        "draft-04 spellings",
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "id": "http://example.com/s",
            "type": "object",
            "definitions": {"n": {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 9}},
            "properties": {
                "n": {"$ref": "#/definitions/n"},
                "t": {"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "boolean"}, "maxItems": 3},
            },
            "dependencies": {"t": ["n"]},
        },
        ['{"n": 1}', '{"n": 9, "t": ["a", true]}', "{}"],
    ),
    (
        "dependentSchemas",
        {
            "type": "object",
            "properties": {"card": {"type": "string", "maxLength": 4}, "cvc": {"type": "integer"}},
            "dependentSchemas": {"card": {"required": ["cvc"]}},
        },
        ['{"card": "1234", "cvc": 1}', '{"cvc": 7}', "{}"],
    ),
    (
        "allOf merged",
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "number", "minimum": 0}}, "required": ["a"]},
                {"properties": {"a": {"type": "integer", "maximum": 5}, "b": {"enum": ["x", "y", 3]}}},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]},
            ]
        },
        ['{"a": 0, "b": "x"}', '{"a": 5, "b": "y"}'],
    ),
    (
        "allOf of $refs",
        {
            "$defs": {
                "named": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]},
                "aged": {"properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}}},
            },
            "allOf": [{"$ref": "#/$defs/named"}, {"$ref": "#/$defs/aged"}],
            "required": ["age"],
        },
        ['{"name": "Ada", "age": 36}'],
    ),
    (
        "allOf with additionalProperties false: only its own properties",
        {
            "allOf": [
                {"properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
                {"properties": {"a": {"minimum": 1}}, "additionalProperties": False},
            ]
        },
        ['{"a": 1}', "{}"],
    ),
    (
        "$ref siblings, 2020-12",
        {
            "$defs": {"s": {"type": "string"}},
            "type": "object",
            "properties": {"code": {"$ref": "#/$defs/s", "pattern": "^[A-Z]{3}$"}},
            "required": ["code"],
        },
        ['{"code": "ABC"}'],
    ),
    (
        "$ref siblings, draft-07 (ignored by jsonschema, applied by ajv: applied)",
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"s": {"type": "string", "maxLength": 3}},
            "type": "object",
            "properties": {"code": {"$ref": "#/definitions/s", "minLength": 2}},
            "required": ["code"],
        },
        ['{"code": "ab"}'],
    ),
    (
        "not",
        {
            "type": "object",
            "properties": {
                "v": {"type": ["string", "integer", "null"], "not": {"type": "null"}},
                "color": {"enum": ["red", "green", "blue"], "not": {"const": "green"}},
                "flag": {"type": "boolean", "not": {"const": False}},
            },
            "required": ["v"],
            "not": {"required": ["secret"]},
        },
        ['{"v": 1}', '{"v": "a", "color": "red", "flag": true}'],
    ),
    (
        "not of several required names, of anyOf and allOf of them",
        {
            "type": "object",
            "properties": {
                "d": {"type": "integer"},
                "x": {"type": "integer"},
                "y": {"type": "integer"},
                "site": {"type": "string", "maxLength": 3},
                "app": {"type": "string", "maxLength": 3},
                "k": {"type": ["object", "null"], "properties": {"j": {"type": "integer"}}, "not": {"required": ["j"]}},
            },
            "not": {
                "anyOf": [
                    {"required": ["d", "x"]},
                    {"required": ["d", "y"]},
                    {"allOf": [{"required": ["site"]}, {"required": ["app"]}]},
                ]
            },
        },
        ['{"d": 1}', '{"x": 1, "y": 2, "site": "a"}', '{"app": "b", "k": {}}', "{}"],
    ),
    (
        "not of a not",
        {
            "type": "object",
            "properties": {
                "n": {"not": {"not": {"type": "integer", "maximum": 5}}},
                "a": {"type": "array", "not": {"not": {"items": {"type": "boolean"}}}},
            },
        },
        ['{"n": 5}', '{"a": [true]}', "{}"],
    ),
    (
        "if required then",
        {
            "type": "object",
            "properties": {"email": {"type": "string", "maxLength": 20}, "verified": {"type": "boolean"}},
            "if": {"required": ["email"]},
            "then": {"required": ["verified"]},
            "else": {"properties": {"verified": False}},
        },
        ['{"email": "a@b.c", "verified": true}', "{}"],
    ),
    (
        "anyOf with siblings",
        {
            "type": "object",
            "properties": {"kind": {"type": "string"}, "r": {"type": "number"}, "w": {"type": "number"}},
            "additionalProperties": False,
            "anyOf": [{"required": ["kind", "r"]}, {"required": ["kind", "w"]}],
        },
        ['{"kind": "circle", "r": 1}', '{"kind": "box", "w": 2.5}'],
    ),
    (
        "required but not listed",
        {"type": "object", "properties": {"id": {"type": "string", "maxLength": 5}}, "required": ["id", "rank"]},
        ['{"id": "a", "rank": 3}', '{"id": "a", "rank": {"x": [1]}}'],
    ),
    (
        "type list with object keywords",
        {
            "type": ["string", "object"],
            "maxLength": 4,
            "properties": {"args": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1}},
            "required": ["args"],
        },
        ['"abcd"', '{"args": ["x"]}'],
    ),
    (
        "formats as bounds",
        {
            "type": "object",
            "properties": {
                "replicas": {"type": ["integer", "null"], "format": "int32"},
                "data": {"type": "string", "format": "byte"},
                "ratio": {"type": "number", "format": "double"},
            },
        },
        ['{"replicas": 2147483647, "data": "QUJD", "ratio": 0.5}', '{"replicas": null}'],
    ),
    (
        "uniqueItems over strings",
        {"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": True},
        ["[]", '["abc"]'],
    ),
    (
        "patternProperties .*",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "patternProperties": {".*": {"type": "integer", "minimum": 0}},
        },
        ['{"a": 1}'],
    ),
    (
        "required beside patternProperties",
        {
            "type": "object",
            "properties": {"b": {"type": "integer"}},
            "patternProperties": {"^[a-e]$": {"type": "integer"}},
            "required": ["a"],
            "minProperties": 2,
        },
        ['{"b": 1, "a": 2}'],
    ),
    (
        "a listed name a pattern matches",
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "type": {"enum": ["x", 1, 2]}},
            "patternProperties": {"^[a-z]+$": {"type": "integer"}},
        },
        ['{"type": 1}', '{"type": 2}', "{}"],
    ),
    (
        "patterns whose names overlap",
        {
            "type": "object",
            "patternProperties": {
                "^a": {"type": "integer"},
                "^ab": {"type": "integer", "minimum": 0},
                "^abc$": {"type": "string"},
                "^j$": {"enum": ["x", 1]},
            },
            "additionalProperties": False,
        },
        ['{"a": -1}', '{"ab": 2}', '{"j": "x"}', "{}"],
    ),
    (
        "enum beside type",
        {
            "type": "object",
            "properties": {
                "k": {"type": "integer", "enum": ["1", 1, 2, 2.5, None]},
                "j": {"type": ["string", "null"], "enum": ["x", 1, None]},
            },
        },
        ['{"k": 1, "j": null}', '{"k": 2, "j": "x"}'],
    ),
    (
        "minProperties over no properties",
        {"type": "object", "minProperties": 1, "maxProperties": 2},
        ['{"k": 1}', '{"k": [], "j": null}'],
    ),
    # xgrammar reads propertyNames alone: beside it, it gives every allowed name any value
    (
        "propertyNames pattern beside additionalProperties",
        {"type": "object", "propertyNames": {"pattern": "^[a-k]+$"}, "additionalProperties": {"type": "integer"}},
        ['{"k": 1}', '{"ab": 2, "j": -3}', "{}"],
    ),
    (
        "propertyNames list beside additionalProperties",
        {
            "type": "object",
            "propertyNames": {"oneOf": [{"enum": ["k", "x"]}, {"const": "j"}]},
            "additionalProperties": {"type": "string", "maxLength": 3},
        },
        ['{"k": "ab"}', '{"x": "abc", "j": ""}'],
    ),
    (
        "propertyNames list beside patternProperties",
        {
            "type": "object",
            "properties": {"k": {"type": "integer"}},
            "patternProperties": {"^[jk]$": {"type": "integer", "minimum": 0}},
            "propertyNames": {"enum": ["k", "j", "secret"], "maxLength": 1},
        },
        ['{"k": 1, "j": 2}', '{"j": 0}', "{}"],
    ),
    (
        "propertyNames beside listed properties",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "secret": {"type": "string"}},
            "propertyNames": {"maxLength": 3},
            "required": ["a"],
        },
        ['{"a": 1}'],
    ),
    (
        "vendor keywords and annotation formats",
        {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "_format": "int32",
            "properties": {"c": {"type": "string", "format": "color", "maxLength": 7, "example": "#fff"}},
            "required": ["c"],
        },
        ['{"c": "#fff"}'],
    ),
]


def _names(node, out: list) -> list:
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("properties", "dependentSchemas", "dependencies") and isinstance(v, dict):
                out.extend(n for n in v if n not in out)
            if k == "required" and isinstance(v, list):
                out.extend(n for n in v if isinstance(n, str) and n not in out)
            _names(v, out)
    elif isinstance(node, list):
        for v in node:
            _names(v, out)
    return out


def _value(rng: random.Random, names: list, depth: int):
    kind = rng.choice(["int", "int", "big", "num", "str", "str", "bool", "null", "list", "obj", "obj"][: 11 if depth else 8])
    if kind == "int":
        return rng.randint(-3, 10)
    if kind == "big":
        return rng.choice([2147483647, 2147483648, -2147483649, 10**12])
    if kind == "num":
        return rng.choice([0.5, -1.25, 3.0, 150.5])
    if kind == "str":
        return rng.choice(
            [
                "",
                "a",
                "ab",
                "ABC",
                "abcd",
                "x@y",
                "QUJD",
                "QUJ",
                "#fff",
                "red",
                "green",
                "x",
                "y",
                "circle",
                "a@b.c",
                "longer text",
            ]
        )
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_value(rng, names, depth - 1) for _ in range(rng.randint(0, 3))]
    return {n: _value(rng, names, depth - 1) for n in names if rng.random() < 0.5}


def _grammar(schema):
    spec = response_format_spec({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    return spec, xgrammar.Grammar.from_ebnf(schema_ebnf(spec.source))


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_each_keyword_group_lets_through_only_what_both_validators_accept(report):
    rng = random.Random(34)
    cases, texts_of = [], []
    for name, schema, examples in CASES:
        spec, grammar = _grammar(schema)
        names = _names(schema, []) + ["k", "j", "secret"]
        texts = {json.dumps(_value(rng, names, 2), **LAYOUT) for _ in range(400)}
        texts |= {t for t in (json.dumps(json.loads(e), **LAYOUT) for e in examples)}
        accepted = sorted(t for t in texts if _is_grammar_accept_string(grammar, t))
        for example in examples:
            assert _is_grammar_accept_string(grammar, example), (name, example, "a valid example refused")
        assert len(accepted) >= len(examples), name
        cases.append({"schema": schema, "texts": accepted})
        texts_of.append((name, schema, accepted))
    by_ajv = run_typescript("ajv_check.ts", {"cases": cases})["out"]
    total = 0
    for (name, schema, accepted), ajv_ok in zip(texts_of, by_ajv):
        check = _validator(schema)
        for text, ok in zip(accepted, ajv_ok):
            errors = list(check.iter_errors(json.loads(text)))
            assert not errors, (name, text, errors[0].message)
            assert ok is not False, (name, text, "ajv refuses it")  # None: a draft-04 schema, which ajv 8 cannot read
        total += len(accepted)
    report(
        f"schema rewrite: {len(CASES)} keyword groups, {total} accepted texts of ~400 random instances each, "
        "every one valid for jsonschema and ajv; every listed valid example accepted"
    )


def test_names_xgrammar_would_not_require_or_count_are_listed():
    """xgrammar enforces no `required` beside patternProperties, and counts a repeated unlisted name toward
    minProperties (`{"d": 1, "d": 2}`; a parser keeps one). Such objects are generated from their listed and
    required names only, and say so; JSONSchemaBench's Handwritten/dep4-dep10 were answered with invalid JSON
    before (4 of 8 answers)."""
    spec, grammar = _grammar({"type": "object", "patternProperties": {"^[a-e]$": {"type": "integer"}}, "required": ["a"]})
    assert [_is_grammar_accept_string(grammar, t) for t in ("{}", '{"b": 1}', '{"a": "x"}', '{"a": 1}')] == [False] * 3 + [True]
    assert list(spec.warnings) == [
        "generated only the listed and required properties (xgrammar enforces neither required "
        "nor listed names' schemas beside patternProperties, nor distinct names for minProperties) at #"
    ]
    _, grammar = _grammar(
        {
            "type": "object",
            "properties": {"c": {"type": "integer"}},
            "required": ["d"],
            "patternProperties": {"^[a-e]$": True},
            "additionalProperties": False,
            "minProperties": 2,
        }
    )
    assert not _is_grammar_accept_string(grammar, '{"d": 1, "d": 2}')
    assert _is_grammar_accept_string(grammar, '{"c": 1, "d": 2}')
    with pytest.raises(StructuredOutputError, match="'minProperties'"):  # two distinct unlisted names: not expressible
        _grammar({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2})


def test_names_two_schemas_apply_to_are_generated_with_both():
    """A validator applies every schema a name gets: its listed one, each pattern found in it. xgrammar
    gives a name one of them (the listed one or a pattern it matches in full), so it let these through,
    each invalid: a listed name with a pattern's weaker schema, a name of one pattern with another's
    schema missing, an enum's value of another type than the `type` beside it."""
    cases = [
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}, "type": {"enum": ["x"]}},
                "patternProperties": {"^[a-z]$": {"type": "integer"}, "^t": {}},
            },
            ['{"a": 1}', '{"type": 5}', '{"a": "x"}'],
            ["{}", '{"type": "x"}'],
        ),  # 'a' (string and integer): nothing
        (
            {
                "type": "object",
                "patternProperties": {"^a": {"type": "integer"}, "^ab": {"type": "string"}},
                "additionalProperties": False,
            },
            ['{"ab": "x"}', '{"ab": 1}'],
            ['{"a": 1}', "{}"],
        ),  # "ab" needs both: no value is
        (
            {"type": "object", "properties": {"k": {"type": "integer", "enum": ["x", 1]}}, "required": ["k"]},
            ['{"k": "x"}'],
            ['{"k": 1}'],
        ),
    ]
    for schema, invalid, valid in cases:
        check = _validator(schema)
        spec, grammar = _grammar(schema)
        for text in invalid:
            assert not check.is_valid(json.loads(text)), text
            assert not _is_grammar_accept_string(grammar, text), (schema, text)
        for text in valid:
            assert check.is_valid(json.loads(text)) and _is_grammar_accept_string(grammar, text), (schema, text)
    assert response_format_spec({"type": "json_schema", "json_schema": {"name": "s", "schema": cases[1][0]}}).warnings == (
        "did not generate names of a pattern that other patterns' schemas contradict at #",
    )
    with pytest.raises(StructuredOutputError, match="'const' at #: no value is of the type \"integer\""):
        _grammar({"type": "integer", "const": "1"})


def test_not_of_required_names_leaves_one_of_them_out():
    """`not` of several required names (one of them absent: a branch each), of anyOf (each negated) and of
    allOf (one part negated); `required` holds on anything but an object, so its `not` leaves only objects."""
    schema = next(s for name, s, _ in CASES if name.startswith("not of several required names"))
    _, grammar = _grammar(schema)
    for text in ('{"d": 1, "x": 2}', '{"d": 1, "y": 2}', '{"site": "a", "app": "b"}', '{"k": null}', '{"k": {"j": 1}}'):
        assert not _validator(schema).is_valid(json.loads(text)) and not _is_grammar_accept_string(grammar, text), text
    with pytest.raises(StructuredOutputError, match="'not' at #/not/anyOf/1: only 'not' of a type, of required names"):
        _grammar({"type": "object", "not": {"anyOf": [{"required": ["a"]}, {"minProperties": 2}]}})


def test_what_was_ignored_is_reported_once_per_keyword():
    spec = response_format_spec({"type": "json_schema", "json_schema": {"name": "s", "schema": CASES[-1][1]}})
    assert spec.warnings == (
        "ignored the unknown keyword 'x-kubernetes-preserve-unknown-fields' at #",
        "ignored the unknown keyword '_format' at #",
        "ignored format 'color' (no validator checks it) at #/properties/c",
        "ignored the unknown keyword 'example' at #/properties/c",
    )
    many = {"type": "object", "properties": {f"p{i}": {"type": "string", "x-order": i} for i in range(5)}}
    spec = response_format_spec({"type": "json_schema", "json_schema": {"name": "s", "schema": many}})
    assert spec.warnings == ("ignored the unknown keyword 'x-order' at #/properties/p0 and 4 more places",)


REFUSED_CASES = [  # (schema, what the error says)
    (3, "schema at # must be an object or a boolean, not integer"),
    ([{"type": "string"}], "schema at # must be an object or a boolean, not array"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}}, "'#/$defs/nowhere' points to nothing"),
    (
        {
            "$defs": {
                "a": {"allOf": [{"$ref": "#/$defs/b"}, {"type": "object"}]},
                "b": {"allOf": [{"$ref": "#/$defs/a"}, {"required": ["x"]}]},
            },
            "$ref": "#/$defs/a",
        },
        "refers to itself through allOf",
    ),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "keyword 'type' at #/allOf/1: no type is in both"),
    (
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"], "additionalProperties": False},
        "'b' is required but not in properties, and additionalProperties is false",
    ),
    ({"type": "strin"}, "schema keyword 'type' at #: \"strin\" is not a JSON Schema type"),
    (
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},  # oneOf: 'a' is in both, so not allowed
            "propertyNames": {"oneOf": [{"enum": ["a"]}, {"pattern": "^[a-z]+$"}]},
        },
        "schema keyword 'propertyNames' at #: names it allows beside a schema for their values",
    ),
    (
        {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"], "propertyNames": {"maxLength": 1}},
        "the required name 'id' is not an allowed name",
    ),
    ({"type": ["string", "null"], "enum": [1, 2]}, 'schema keyword \'enum\' at #: no value is of the type ["string", "null"]'),
]


@pytest.mark.parametrize("schema, message", REFUSED_CASES)
def test_a_schema_that_is_not_json_schema_or_has_no_value_is_refused_by_name(schema, message):
    with pytest.raises(StructuredOutputError, match=None) as err:
        response_format_spec({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert message in str(err.value)


def test_a_huge_schema_is_refused_within_the_limits():
    """5 MB of nested subschemas: refused by the rewrite's node count, in well under a second a MB."""
    import time

    node: dict = {"type": "string"}
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "object", "properties": {f"q{j}": node for j in range(60)}} for i in range(4000)},
    }
    assert len(json.dumps(wide)) > 5_000_000
    start = time.perf_counter()
    with pytest.raises(StructuredOutputError, match="more than 20000 subschemas"):
        response_format_spec({"type": "json_schema", "json_schema": {"name": "s", "schema": wide}})
    assert time.perf_counter() - start < 5


def _bench_schemas() -> list[dict]:
    """JSONSchemaBench's schemas: every third (in load order) in the suite, all of them
    with LANTERN_PARITY_ALL=1 (about three times as long: the two xgrammar builds compile every one)."""
    folder = Path(os.environ.get("LANTERN_JSONSCHEMABENCH", repo_root().parent / "shared" / "jsonschemabench"))
    rows = load(folder) if folder.is_dir() else []
    return rows if os.environ.get("LANTERN_PARITY_ALL") == "1" else rows[::3]


def test_browser_and_server_decide_and_write_alike():
    """The browser's bundle under Node and the server's V8 give the same checked schema text, warnings, size (so
    the same accept or refuse) and error for each case above and each JSONSchemaBench schema (one source, two
    bundles and two JSON bridges); the EBNF text of the two xgrammar builds alike where both xgrammar builds print alike (they
    print a bounded repeat, {n,m}, differently), and where they do not, the two grammars accept the same
    of the benchmark's test instances."""
    bench = _bench_schemas()
    rows = [{"schema": s, "tests": []} for _, s, _ in CASES] + [{"schema": s, "tests": []} for s, _ in REFUSED_CASES] + bench
    defaults = {"maxLength": 256, "maxItems": 64}
    ts = run_typescript("schema_parity.ts", {"schemas": [r["schema"] for r in rows], "defaults": defaults})["out"]
    same_text = instances = 0
    for row, web in zip(rows, ts):
        try:
            spec = response_format_spec({"type": "json_schema", "json_schema": {"name": "s", "schema": row["schema"]}}, defaults)
        except StructuredOutputError as err:
            assert web == {"error": f"InvalidRequestError: {err}"}, row["schema"]
            continue
        assert "error" not in web, (web, row["schema"])
        assert json.loads(web["source"]) == json.loads(spec.source) and web["warnings"] == list(spec.warnings)
        assert web["size"] == grammar_size(json.loads(spec.source))
        try:
            ebnf = schema_ebnf(spec.source)
        except RuntimeError:  # xgrammar refuses the checked schema: so does the browser's
            assert web["ebnf"] is None, row["schema"]
            continue
        if ebnf == web["ebnf"]:
            same_text += 1
            continue
        assert "{" in web["ebnf"] or "repeat" in ebnf, row["schema"]
        ours, theirs = xgrammar.Grammar.from_ebnf(ebnf), xgrammar.Grammar.from_ebnf(web["ebnf"])
        for test in row["tests"]:
            text = json.dumps(in_schema_order(test["data"], row["schema"], row["schema"]), **LAYOUT)
            assert _is_grammar_accept_string(ours, text) == _is_grammar_accept_string(theirs, text), (row["schema"], text)
            instances += 1
    assert same_text >= len(CASES) // 2
    if bench:
        print(
            f"{len(bench)} JSONSchemaBench schemas: {same_text} grammars alike as text, {instances} test instances "
            "alike on the others"
        )
