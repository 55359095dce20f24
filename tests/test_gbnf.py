"""The wasm device's grammar: xgrammar's printed grammar translated to llama.cpp GBNF (gbnf.ts).

Each translated grammar is read back by xgrammar (whose EBNF reads GBNF) and must accept exactly the
strings the original accepts, over valid and invalid samples; and it may only use what llama.cpp's
GBNF parser reads (rule names of letters, digits and '-'; its escapes). The browser tests
(tests/test_wasm_device.py) run the same grammars inside llama.cpp.
"""

from __future__ import annotations

import json
import re

import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from test_structured import run_typescript

from lantern.server.grammars import schema_ebnf
from lantern.server.structured import check_schema

SEPARATORS = (", ", ": ")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z-]+$"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", 'b"c', "é"]}, "maxItems": 2},
        "score": {"type": ["number", "null"]},
        "note": {"type": "string", "maxLength": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
SCHEMA_OK = [
    '{"name": "ab-c", "age": 0}',
    '{"name": "x", "age": 12, "tags": ["a", "b\\"c"]}',
    '{"name": "x", "age": 1, "score": -1.5e3}',
    '{"name": "x", "age": 1, "score": null, "note": "é-a"}',
    '{"name": "x", "age": 1, "tags": ["é"]}',
]
SCHEMA_BAD = [
    '{"name": "AB", "age": 0}',
    '{"name": "x", "age": -1}',
    '{"name": "x", "age": 1, "tags": ["a", "a", "a"]}',
    '{"name": "x"}',
    '{"name": "x", "age": 01}',
    '{"name": "x", "age": 1, "note": "abcd"}',
    '{"name":"x", "age": 1}',
    '{"name": "x", "age": 1, "other": 1}',
    '{"name": "x\x01", "age": 1}',
]

# Number ranges: Lantern's own rules (webruntime/src/numbers.ts) swapped into xgrammar's grammar
BOUNDED = {
    "type": "object",
    "properties": {
        "t": {"type": "number", "minimum": -40.5, "exclusiveMaximum": 50},
        "n": {"type": ["integer", "null"], "exclusiveMinimum": -3, "maximum": 120},
    },
    "required": ["t", "n"],
    "additionalProperties": False,
}
BOUNDED_OK = ['{"t": -40.5, "n": 120}', '{"t": 49.999, "n": null}', '{"t": 0, "n": -2}', '{"t": -0.25, "n": 0}']
BOUNDED_BAD = [
    '{"t": -40.51, "n": 1}',
    '{"t": 50, "n": 1}',
    '{"t": 1, "n": -3}',
    '{"t": 1, "n": 121}',
    '{"t": 1e1, "n": 1}',
    '{"t": -0, "n": 1}',
    '{"t": 1, "n": 1.0}',
]

TOOL_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<tool_call>"],
        "at_least_one": False,
        "stop_after_first": False,
        "tags": [
            {
                "type": "tag",
                "begin": '<tool_call>{"name": "add", "arguments": ',
                "content": {
                    "type": "json_schema",
                    "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                },
                "end": "}</tool_call>",
            }
        ],
    },
}
TOOL_OK = [
    '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": { "a" :2 }}</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": {"a": 3}}</tool_call>',
]
TOOL_BAD = [
    '<tool_call>{"name": "sub", "arguments": {"a": 1}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"a": "1"}}</tool_call>',
]

REGEX = {"type": "structural_tag", "format": {"type": "regex", "pattern": r"[A-Z][a-z\-\]]{2,4}\.x*"}}
REGEX_OK = ["Abc.", "Q-]z.xx", "Zzzzz."]
REGEX_BAD = ["abc.", "Ab.", "Abcdef.", "Abc"]

EBNF = 'root ::= "say " word ("," word)*\nword ::= [^\\x00-\\x20,\\\\"]+ | "\\"" [a-c]? "\\""'
# Patterns with lengths, uniqueItems and multipleOf: webruntime/src/strings.ts, unique.ts, numbers.ts
EXACT = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z\\-\\]]{2}\\d$", "maxLength": 3},
        "tags": {"type": "array", "items": {"enum": ["a", 'b"c']}, "uniqueItems": True},
        "q": {"type": "integer", "multipleOf": 5, "maximum": 20},
        "s": {"type": "string", "minLength": 1, "maxLength": 2},
    },
    "required": ["code", "tags", "q", "s"],
    "additionalProperties": False,
}
EXACT_OK = [
    '{"code": "A]1", "tags": ["b\\"c", "a"], "q": 15, "s": "\\u00e9\\n"}',
    '{"code": "--0", "tags": [], "q": -5, "s": "x"}',
]
EXACT_BAD = [
    '{"code": "A]", "tags": [], "q": 0, "s": ""}',
    '{"code": "AB1", "tags": ["a", "a"], "q": 0, "s": ""}',
    '{"code": "AB1", "tags": [], "q": 25, "s": ""}',
    '{"code": "AB1", "tags": [], "q": 7, "s": ""}',
    '{"code": "AB1", "tags": [], "q": 0, "s": "\t"}',
    '{"code": "AB1", "tags": [], "q": 0, "s": "abc"}',
]
EBNF_OK = ["say hi", 'say a,b,"c"', 'say é,""']
EBNF_BAD = ["say ", "say a b", 'say "d"', "say a,"]

# what llama.cpp's GBNF parser reads: rule names and escapes
GBNF_RULE = re.compile(r"^[A-Za-z0-9-]+ ::= ")
GBNF_ESCAPES = re.compile(r'\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|[nrt\\"\[\]])')


def printed(g: xgr.Grammar) -> str:
    return str(g)


def test_translated_grammars_accept_exactly_what_xgrammar_accepts():
    cases = [
        (
            xgr.Grammar.from_json_schema(
                json.dumps(SCHEMA), any_whitespace=False, indent=None, separators=SEPARATORS, strict_mode=True
            ),
            "root",
            SCHEMA_OK,
            SCHEMA_BAD,
        ),
        (xgr.Grammar.from_structural_tag(json.dumps(TOOL_TAG)), None, TOOL_OK, TOOL_BAD),
        (xgr.Grammar.from_structural_tag(json.dumps(REGEX)), None, REGEX_OK, REGEX_BAD),
        (xgr.Grammar.from_ebnf(EBNF), "root", EBNF_OK, EBNF_BAD),
        (xgr.Grammar.from_ebnf(schema_ebnf(json.dumps(check_schema(BOUNDED)))), "root", BOUNDED_OK, BOUNDED_BAD),
        (xgr.Grammar.from_ebnf(schema_ebnf(json.dumps(check_schema(EXACT)))), "root", EXACT_OK, EXACT_BAD),
    ]
    texts = [printed(g) for g, *_ in cases]
    roots = [root or re.findall(r"^(\S+) ::=", text, re.M)[-1] for (_, root, *_), text in zip(cases, texts)]
    out = run_typescript("gbnf.ts", {"cases": [{"text": t, "root": r} for t, r in zip(texts, roots)]})["out"]
    for (original, _, good, bad), got in zip(cases, out):
        assert "error" not in got, got
        gbnf = got["grammar"]
        for line in gbnf.splitlines():
            assert GBNF_RULE.match(line), line
            # every backslash is one of llama.cpp's escapes
            assert "\\" not in GBNF_ESCAPES.sub("", line), line
            assert "(=" not in line
        back = xgr.Grammar.from_ebnf(gbnf)
        for s in good:
            assert _is_grammar_accept_string(original, s), s  # the samples themselves are right
            assert _is_grammar_accept_string(back, s), (s, gbnf)
        for s in bad:
            assert not _is_grammar_accept_string(original, s), s
            assert not _is_grammar_accept_string(back, s), (s, gbnf)
    # the tool calls' grammar is lazy: free text until the trigger, then the calls
    assert out[1]["triggers"] == ["<tool_call>"]
    assert out[0]["triggers"] is None and out[2]["triggers"] is None


def test_a_trigger_inside_other_text_is_refused_by_name():
    fmt = {
        "type": "structural_tag",
        "format": {"type": "sequence", "elements": [{"type": "const_string", "value": "Answer: "}, TOOL_TAG["format"]]},
    }
    text = printed(xgr.Grammar.from_structural_tag(json.dumps(fmt)))
    [got] = run_typescript("gbnf.ts", {"cases": [{"text": text, "root": re.findall(r"^(\S+) ::=", text, re.M)[-1]}]})["out"]
    assert got["error"].startswith("InvalidRequestError: this structural tag is not supported on the wasm device")


# llama.cpp's parser limits (gbnf.ts): a repetition bound above 2000 reads as unbounded there, a minimum
# above it is refused, and its left-recursion check gives up about 256 rules deep
REPEATS = [
    ('root ::= "a"{0,2100}', ["", "a" * 63, "a" * 64, "a" * 2100], ["a" * 2101]),
    ('root ::= "a"{2050,2060} "b"', ["a" * 2050 + "b", "a" * 2060 + "b"], ["a" * 2049 + "b", "a" * 2061 + "b"]),
    ('root ::= ("ab" | "c"){1,5000}', ["c", "ab" * 2500 + "c" * 2500], ["", "c" * 5001]),
]
LONG_STRING = {"type": "string", "maxLength": 2500}
# an object of optional properties: xgrammar writes them as a chain, each link a leftmost reference
OPTIONAL = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(200)}, "additionalProperties": False}


def left_depth(gbnf: str) -> int:
    """The longest chain of leftmost rule references (llama.cpp's left-recursion check recurses along it;
    each group in a rule body is one more rule there)."""
    bodies = dict(line.split(" ::= ", 1) for line in gbnf.splitlines())
    memo: dict[str, int] = {}

    def depth(name: str) -> int:
        if name not in memo:
            memo[name] = 1
            memo[name] = 1 + body_depth(bodies[name])
        return memo[name]

    def body_depth(body: str) -> int:
        # leftmost symbols: what starts the body, each alternative and each group
        lead = re.findall(r"(?:^|\| |\( )((?:\( )*)([A-Za-z0-9-]+)(?=\s|$)", body)
        return max([opens.count("(") + depth(name) for opens, name in lead if name in bodies], default=0)

    return max(depth(n) for n in bodies)


def test_grammars_at_llama_cpp_limits_stay_exact():
    schemas = [LONG_STRING, OPTIONAL]
    texts = [printed(xgr.Grammar.from_ebnf(g)) for g, _, _ in REPEATS] + [
        printed(xgr.Grammar.from_ebnf(schema_ebnf(json.dumps(check_schema(s))))) for s in schemas
    ]
    out = run_typescript("gbnf.ts", {"cases": [{"text": t, "root": "root"} for t in texts]})["out"]
    samples = [(good, bad) for _, good, bad in REPEATS] + [
        (['"' + "é" * 2500 + '"', '""'], ['"' + "a" * 2501 + '"']),
        (['{"p0": 1, "p199": 2}', "{}", '{"p7": 0}'], ['{"p1": 1, "p0": 2}', '{"p200": 1}']),
    ]
    for got, (good, bad) in zip(out, samples):
        assert "error" not in got, got
        gbnf = got["grammar"]
        for low, high in re.findall(r"\{(\d+)(?:,(\d*))?\}", gbnf):
            assert int(low) < 2000 and int(high or 0) < 2000, gbnf
        back = xgr.Grammar.from_ebnf(gbnf)
        for s in good:
            assert _is_grammar_accept_string(back, s), (s[:40], len(s))
        for s in bad:
            assert not _is_grammar_accept_string(back, s), (s[:40], len(s))
    # the optional properties' chain: one rule a property, not three as xgrammar prints it (3 x 200 would
    # be past llama.cpp's ~256; tests/test_wasm_device.py has llama.cpp parse it)
    assert 190 <= left_depth(out[-1]["grammar"]) < 220
