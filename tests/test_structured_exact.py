"""Exact structured output, grammars only (no model, seconds): number ranges and multiples
(webruntime/src/numbers.ts) accept exactly the numbers a standard validator finds within the bounds
(IEEE-754 doubles); patterns and lengths (strings.ts) let through only strings both validators accept,
and every ASCII string both match in full; uniqueItems arrays (unique.ts) exactly the valid ones; string
formats let through only strings jsonschema's FormatChecker and ajv-formats both find valid. The rules
are the ones `lantern serve` writes: the TypeScript run in V8 (lantern.server.schema_host), the one copy
the browser bundles too."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import xgrammar
from xgrammar.testing import _get_matcher_from_grammar

from test_structured import run_typescript

from lantern import contracts
from lantern.server.schema_host import HOST, HostRefusal
from lantern.server.grammars import schema_ebnf
from lantern.server.structured import SUPPORT, StructuredOutputError, check_schema

MAX_DIGITS = HOST.call("constants")["maxDigits"]
# compiler/contracts/unicode_categories.json's categories: {category: [(first, last) code point]}
CATEGORIES = {
    cat: [(int(a, 16), int(b or a, 16)) for a, _, b in (r.partition("-") for r in text.split())]
    for cat, text in contracts.read("unicode_categories.json")["categories"].items()
}


def exact_rules(kind: str, *args) -> list[str]:
    """The rules one grammar writer makes (kind: number or integer with a schema; string with a pattern, minLength
    and maxLength; unique with items, minItems and maxItems), or HostRefusal with the writer's error."""
    return HOST.call("exactRules", kind, *args)["rules"]


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# The texts the grammar writes: no exponent, no "-0", at most MAX_DIGITS digits (a leading "0." not counted).
WRITTEN = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


def grammar(kind: str, schema: dict):
    """accepts(text) -> bool: xgrammar's own matcher on the rules for ``schema``, one matcher reused."""
    return accepts_of(exact_rules(kind, schema), "n")


def accepts_of(rules: list[str], name: str):
    matcher = _get_matcher_from_grammar(xgrammar.Grammar.from_ebnf("\n".join([f"root ::= {name}_0", *rules])))

    def accepts(text: str) -> bool:
        try:
            return matcher.accept_string(text) and matcher.is_terminated()
        finally:
            matcher.reset()

    return accepts


def writable(text: str, kind: str) -> bool:
    m = WRITTEN.fullmatch(text)
    if not m or (kind == "integer" and m[2]) or (text.startswith("-") and float(text) == 0):
        return False
    whole, _, fraction = text.lstrip("-").partition(".")
    return (0 if whole == "0" else len(whole)) + len(fraction) <= MAX_DIGITS


def valid(schema: dict, text: str) -> bool:
    value = json.loads(text)
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def near(values) -> set[str]:
    """Texts on, just inside and just outside each value, and a few steps away."""
    out = set()
    for v in values:
        for delta in (0, 1, 0.5, 0.1, 0.01, 1e-6, 1e-9, 1e-13):
            for x in (v - delta, v + delta):
                out |= {repr(float(x)), f"{x:.14g}", f"{x:.15g}", f"{x:.3f}", str(round(x))}
        if float(v).is_integer():
            out |= {str(int(v)), f"{int(v)}.0", f"{int(v)}.000001"}
    return {t for t in out if "e" not in t and "n" not in t}


@pytest.mark.parametrize(
    "kind, schema, inside, outside",
    [
        (
            "number",
            {"minimum": -1.5, "maximum": 2.25},
            ["-1.5", "2.25", "0", "-1.4999", "2.2499999"],
            ["-1.50001", "2.2500001", "-2", "3"],
        ),
        (
            "number",
            {"exclusiveMinimum": -1.5, "exclusiveMaximum": 2.25},
            ["-1.4999999", "2.2499999", "0"],
            ["-1.5", "2.25", "-1.50", "2.250"],
        ),
        ("number", {"exclusiveMinimum": 0}, ["0.000000000000001", "1", "123456789012345"], ["0", "0.0", "-0.1", "-0"]),
        ("number", {"minimum": 0, "exclusiveMaximum": 1}, ["0", "0.0", "0.999999999999999"], ["1", "1.0", "-0.000001"]),
        ("number", {"minimum": 0.1, "maximum": 0.3}, ["0.1", "0.2", "0.3", "0.25"], ["0.09999", "0.30001", "0.300000000000001"]),
        ("number", {"maximum": -0.5}, ["-0.5", "-0.50", "-7", "-100000"], ["-0.49999", "0", "1"]),
        ("number", {"exclusiveMaximum": 0.30000000000000004}, ["0.3", "0.300000000000000"], ["0.31", "0.30000000000000004"]),
        ("integer", {"minimum": -5, "exclusiveMaximum": 3}, ["-5", "0", "2"], ["-6", "3", "2.0", "1.5", "-0"]),
        ("integer", {"exclusiveMinimum": 17.5, "maximum": 120}, ["18", "120", "99"], ["17", "121", "125", "129", "1200"]),
        ("integer", {"minimum": 0, "maximum": 10**6}, ["0", "1000000", "999999"], ["1000001", "-1", "10000000"]),
        (
            "integer",
            {"minimum": -(10**12), "maximum": -(10**11)},
            ["-1000000000000", "-100000000000"],
            ["-99999999999", "-1000000000001"],
        ),
    ],
)
def test_values_just_inside_each_bound_are_accepted_and_just_outside_refused(kind, schema, inside, outside):
    g = grammar(kind, schema)
    for text in inside:
        assert g(text) and valid({"type": kind, **schema}, text), (schema, text)
    for text in outside:
        assert not g(text), (schema, text)


def random_schemas(rng: random.Random, count: int):
    def bound():
        pick = rng.random()
        if pick < 0.3:
            return rng.randint(-1000, 1000)
        if pick < 0.6:
            return round(rng.uniform(-100, 100), rng.randint(0, 4))
        if pick < 0.75:
            return rng.choice([0, 0.1, 0.2, 0.3, 1e-7, 1 / 3, 0.1 + 0.2, 2.5e-5, 1e15, 123456789.123, -1e-3])
        return rng.uniform(-5, 5)  # 16-17 digit doubles

    for _ in range(count):
        kind = rng.choice(["number", "integer"])
        schema = {key: bound() for key in rng.sample(BOUNDS, rng.randint(1, 3))}
        if rng.random() < 0.3:
            schema["multipleOf"] = rng.choice([1, 2, 3, 7, 10, 25, 0.5, 0.25, 2.5, 0.125])
        yield kind, schema


def test_random_bounds_accept_exactly_what_jsonschema_validates(report):
    """For random bounds (integers, short and 17-digit decimals, either side of zero, inclusive or
    not): on texts around every bound and at random, the grammar accepts a text iff it is one the
    grammar writes and jsonschema finds it within the bounds."""
    rng = random.Random(16)
    checked = empty = accepted = 0
    for kind, schema in random_schemas(rng, 400):
        texts = near(schema.values()) | {f"{rng.uniform(-2000, 2000):.{rng.randint(0, 6)}f}" for _ in range(30)}
        want = {t for t in texts if writable(t, kind) and valid({"type": kind, **schema}, t)}
        try:
            g = grammar(kind, schema)
        except HostRefusal as err:
            assert err.kind == "NumberRangeError", err
            assert not want, (kind, schema, sorted(want)[:5])
            empty += 1
            continue
        got = {t for t in texts if g(t)}
        assert got == want, (kind, schema, sorted(got ^ want)[:5])
        checked += len(texts)
        accepted += len(got)
    report(
        f"number ranges: 400 random bounds (30% with a multipleOf), {checked} texts: the grammar accepts the "
        f"{accepted} jsonschema validates and no other; {empty} ranges hold no {MAX_DIGITS}-digit number and are refused"
    )


@pytest.mark.parametrize(
    "schema, inside, outside",
    [
        ({"type": "integer", "multipleOf": 3, "minimum": -10, "maximum": 10}, ["-9", "0", "3", "9"], ["-10", "-1", "10", "12"]),
        ({"type": "number", "multipleOf": 0.25}, ["0.25", "-1.75", "3", "1.50", "2.0", "100.000"], ["0.3", "0.125", "1.2"]),
        ({"type": "number", "multipleOf": 2, "exclusiveMaximum": 5}, ["4", "4.0", "-2", "0"], ["5", "6", "3", "4.5"]),
        ({"type": "integer", "multipleOf": 0.5}, ["1", "-7", "0"], ["1.5", "0.5"]),
    ],
)
def test_multiple_of_is_exact(schema, inside, outside):
    g = accepts_of(exact_rules(schema["type"], schema), "n")
    for text in inside:
        assert g(text) and valid(schema, text), (schema, text)
    for text in outside:
        assert not g(text), (schema, text)


def test_a_multiple_of_validators_cannot_divide_exactly_is_refused_by_name():
    for bad, words in [
        (0.01, "not a binary fraction"),
        (0.1, "0.07 / 0.01"),
        (0, "above 0"),
        (-2, "above 0"),
        (251, "above 250"),
    ]:
        with pytest.raises(StructuredOutputError, match=re.escape("'multipleOf'")) as err:
            check_schema({"type": "number", "multipleOf": bad})
        assert words in str(err.value), (bad, err.value)
    assert 0.07 / 0.01 != 7  # why 0.01 is refused: both validators divide doubles


# ---- patterns and lengths ------------------------------------------------------------------------

ATOMS = [
    "a",
    "b",
    "z",
    "0",
    "7",
    "\\.",
    "\\d",
    "\\w",
    "\\s",
    "\\D",
    "\\W",
    "\\S",
    ".",
    "[a-c]",
    "[^a]",
    "[^\\d]",
    "[A-Z_]",
    "[\\w-]",
    "\\u00e9",
    "[é-ë]",
    "\\\\",
    '"',
    "\\/",
    " ",
    "\\n",
    "\\t",
    "[\\s\\S]",
    "中",
    "\\x41",
    "[-.]",
]
ALPHABET = 'abz07.AZ_- "\\/\n\t\r\x7féê中٣\u00a0\x1c\x01'


def random_pattern(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        if depth < 2 and rng.random() < 0.2:
            inner = random_pattern(rng, depth + 1)
            atom = f"({'?:' if rng.random() < 0.3 else ''}{inner}{'|' + random_pattern(rng, depth + 1) if rng.random() < 0.5 else ''})"
        else:
            atom = rng.choice(ATOMS)
        parts.append(atom + rng.choice(["", "", "", "*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}", "*?"]))
    return ("^" if rng.random() < 0.5 else "") + "".join(parts) + ("$" if rng.random() < 0.5 else "")


def sample(node: dict, rng: random.Random) -> str:
    """A random string a pattern describes, from its parse (strings.ts's Node, as schema_host returns it:
    {t: set, chars: [[lo, hi]...]}, {t: cat, items}, {t: alt, branches}, {t: rep, node, lo, hi}; anchors
    match empty)."""
    kind = node["t"]
    if kind == "set":
        lo, hi = rng.choice(node["chars"])
        return chr(rng.randint(lo, min(hi, lo + 40)))
    if kind == "cat":
        return "".join(sample(n, rng) for n in node["items"])
    if kind == "alt":
        return sample(rng.choice(node["branches"]), rng)
    if kind == "rep":
        hi = node["hi"] if node["hi"] is not None else node["lo"] + 3
        return "".join(sample(node["node"], rng) for _ in range(rng.randint(node["lo"], hi)))
    return ""


def json_text(s: str) -> str:
    """A string as the grammar writes it: ASCII, short escapes, \\uXXXX for the rest (DEL included)."""
    return json.dumps(s).replace("\x7f", "\\u007f")


def test_patterns_and_lengths_let_through_only_valid_strings(report):
    """150 random patterns (classes, shorthands, negations, groups, quantifiers, anchors, escapes, non-ASCII)
    with random lengths, on strings sampled from each pattern, mutated and random: every string the
    grammar accepts is valid for jsonschema and for ajv (the schema as given); among ASCII strings
    (where Python and JavaScript read these patterns alike) it accepts exactly those both match in
    full within the lengths."""
    rng = random.Random(16)
    cases, accepted, ascii_checked, refused = [], 0, 0, 0
    while len(cases) < 150:
        pattern = random_pattern(rng)
        lo = rng.choice([0, 0, 1, 2])
        hi = rng.choice([None, None, lo + rng.randint(0, 4)])
        schema = {"type": "string", "pattern": pattern, "minLength": lo, **({"maxLength": hi} if hi is not None else {})}
        try:
            rules = exact_rules("string", pattern, lo, hi)
        except HostRefusal as err:
            assert err.kind == "PatternError", err
            refused += 1
            continue
        node = HOST.call("parsePattern", pattern)
        texts = {sample(node, rng) for _ in range(12)}
        texts |= {
            t[:k] + rng.choice(ALPHABET) + t[k + 1 :] for t in sorted(texts) for k in range(len(t) + 1) if rng.random() < 0.3
        }
        texts |= {"".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 5))) for _ in range(10)}
        cases.append((schema, sorted(texts), accepts_of(rules, "s")))
    anchored = [
        {"schema": {**s, "pattern": f"^(?:{s['pattern']})$"}, "texts": [json.dumps(t) for t in texts]} for s, texts, _ in cases
    ]
    plain = [{"schema": s, "texts": [json.dumps(t) for t in texts]} for s, texts, _ in cases]
    by_ajv = run_typescript("ajv_check.ts", {"cases": plain + anchored})["out"]
    for (schema, texts, g), ajv_ok, ajv_full in zip(cases, by_ajv, by_ajv[len(cases) :]):
        validator = jsonschema.Draft202012Validator(schema)
        for text, ok, full in zip(texts, ajv_ok, ajv_full):
            got = g(json_text(text))
            if got:
                assert validator.is_valid(text) and ok, (schema, text)
                accepted += 1
            if all(ord(c) < 0x80 and not 0x1C <= ord(c) <= 0x1F for c in text):
                both = (
                    re.fullmatch(schema["pattern"], text) is not None
                    and full
                    and schema["minLength"] <= len(text) <= schema.get("maxLength", len(text))
                )
                assert got == both, (schema, text, got)
                ascii_checked += 1
    total = sum(len(t) for _, t, _ in cases)
    report(
        f"patterns: 150 random patterns with lengths, {total} strings: {accepted} accepted, each valid for "
        f"jsonschema and ajv; on {ascii_checked} ASCII strings accepted = matched in full by both; "
        f"{refused} patterns refused (empty or not read alike)"
    )


@pytest.mark.parametrize(
    "pattern, what",
    [
        ("a^b", "no string matches it"),
        ("(?=a)a", "lookaround"),
        ("\\bx", "\\b"),
        ("\\1", "\\1"),
        ("[]", "empty class"),
        ("a{3,1}", "minimum is above"),
        ("a**", "quantifier on a quantifier"),
        ("(a", "unclosed '('"),
        ("a)", "unmatched"),
        ("[\\d-z]", "class shorthand"),
        ("😀", "above U+FFFF"),
        ("\\p{Script=Latin}", "\\p{Script=Latin}"),
        ("\\p{Foo}", "unknown Unicode property"),
        ("\\pL", "without a {name}"),
        ("\\p{Cn}", "no string matches"),
        ("a{", "starts no"),
        ("[[a]]", "inside a class"),
    ],
)
def test_patterns_not_enforced_exactly_are_refused_by_name(pattern, what):
    with pytest.raises(StructuredOutputError, match=re.escape("'pattern'")) as err:
        check_schema({"type": "string", "pattern": pattern})
    assert what in str(err.value), err.value


UNICODE_PATTERNS = [
    "^\\p{Lu}\\p{Ll}*$",
    "^[\\p{L}\\p{N} ]+$",
    "^[^\\p{P}\\p{S}]+$",
    "^\\P{L}{1,2}$",
    "^\\p{gc=Nd}+$",
    "^[\\p{Zs}A-Za-z0-9+\\.,\\-_:;()]*$",  # a real schema's (JSONSchemaBench Github_ultra, bio.tools)
    "^\\p{Letter}\\p{General_Category=Mn}?$",
    "^\\p{Assigned}$",
    "^[\\P{Cn}x]$",
    "^(?:\\p{LC}|\\p{Zl})$",
]


def test_unicode_property_classes_let_through_only_what_both_engines_count(report):
    """\\p{..} and \\P{..} (general categories from compiler/contracts/unicode_categories.json): on strings of characters
    from all over the Basic Multilingual Plane, every string the grammar accepts is valid for ajv (which reads
    a pattern with the u flag) and matches in Python's `regex` (Python's `re` has no \\p); where the table
    knows each character's category, it accepts exactly what ajv validates."""
    import regex

    rng = random.Random(18)
    spread = [chr(c) for c in range(0x20, 0x10000, 5) if not 0xD800 <= c <= 0xDFFF]
    texts = sorted(
        set(spread)
        | {"".join(rng.choice(spread) for _ in range(rng.randint(2, 4))) for _ in range(400)}
        | {"Émile", "Ab", "12", "a b", "\u0295", "x\u0300"}
    )
    cases = [(pattern, accepts_of(exact_rules("string", pattern, 0, None), "s")) for pattern in UNICODE_PATTERNS]
    by_ajv = run_typescript(
        "ajv_check.ts",
        {"cases": [{"schema": {"type": "string", "pattern": p}, "texts": [json.dumps(t) for t in texts]} for p, _ in cases]},
    )["out"]
    known = {chr(c) for ranges in CATEGORIES.values() for lo, hi in ranges for c in range(lo, hi + 1)}
    accepted = exact = 0
    for (pattern, g), ajv_ok in zip(cases, by_ajv):
        for text, ok in zip(texts, ajv_ok):
            got = g(json_text(text))
            if got:
                assert ok and regex.fullmatch(pattern, text), (pattern, text)
                accepted += 1
            if all(c in known for c in text):
                assert got == ok, (pattern, text, got)
                exact += 1
    report(
        f"\\p classes: {len(cases)} patterns, {len(texts)} strings each: {accepted} accepted, each valid for ajv and "
        f"Python's regex; {exact} of known characters accepted exactly when ajv validates them"
    )


def test_the_unicode_table_agrees_with_python_and_javascript():
    """compiler/contracts/unicode_categories.json (ci/gen/unicode_table.py rewrites it) against the Python and Node this
    runs with: each code point it lists under a category has that category in unicodedata and in
    JavaScript's RegExp (through ajv's pattern)."""
    import unicodedata

    cases = []
    for cat, ranges in CATEGORIES.items():
        codes = [c for lo, hi in ranges for c in range(lo, hi + 1)]
        assert all(unicodedata.category(chr(c)) == cat for c in codes), cat
        cases.append(
            {"schema": {"type": "string", "pattern": f"^\\p{{gc={cat}}}$"}, "texts": [json.dumps(chr(c)) for c in codes]}
        )
    for case, out in zip(cases, run_typescript("ajv_check.ts", {"cases": cases})["out"]):
        assert all(out), (case["schema"], [json.loads(t) for t, ok in zip(case["texts"], out) if not ok][:5])
    assert sum(len(c["texts"]) for c in cases) > 60000


def test_long_strings_beyond_the_merged_size_stay_exact():
    """A 700-character bound makes an automaton past MAX_MERGED states, left unmerged: still exact."""
    g = accepts_of(exact_rules("string", "[a-c]*x", 3, 700), "s")
    assert g(json.dumps("ab" * 349 + "x")) and not g(json.dumps("ab" * 350 + "x")) and not g(json.dumps("ax"))
    assert not g(json.dumps("ab" * 10 + "y"))


def test_xgrammar_alone_lets_invalid_strings_through():
    """Why Lantern writes string rules itself: xgrammar 0.1.27 on the same schemas."""
    from xgrammar.testing import _is_grammar_accept_string as raw_accepts

    raw = lambda schema: xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)  # noqa: E731
    assert raw_accepts(raw({"type": "string", "pattern": "^[^a]+$"}), '"""')  # a raw quote: not JSON
    assert raw_accepts(raw({"type": "string", "pattern": "^a$", "maxLength": 0}), '"a"')  # lengths dropped
    assert raw_accepts(raw({"type": "string", "maxLength": 3}), '"\t"')  # a raw tab: not JSON
    ours = lambda schema: accepts_of(  # noqa: E731
        exact_rules("string", schema.get("pattern"), schema.get("minLength", 0), schema.get("maxLength")), "s"
    )
    assert not ours({"pattern": "^[^a]+$"})('"""') and ours({"pattern": "^[^a]+$"})('"\\""')
    assert not ours({"maxLength": 3, "minLength": 1})('"\t"') and ours({"maxLength": 3, "minLength": 1})('"\\t"')
    # a maxLength alone is one repeated class (fast to mask): raw characters, escapes left out
    assert not ours({"maxLength": 3})('"\t"') and not ours({"maxLength": 3})('"\\t"') and ours({"maxLength": 3})('"é"')


# ---- uniqueItems ----------------------------------------------------------------------------------


def test_unique_items_accept_exactly_the_valid_arrays(report):
    rng = random.Random(16)
    pool = ["red", "green", 'b"q', "é", 1, 2.5, True, False, None, 0]
    checked = accepted = 0
    for _ in range(60):
        values = rng.sample(pool, rng.randint(1, 5))
        items = rng.choice([{"enum": values}, {"const": values[0]}, {"type": "boolean"}])
        lo = rng.randint(0, 3)
        hi = rng.choice([None, lo + rng.randint(0, 2)])
        schema = {
            "type": "array",
            "items": items,
            "uniqueItems": True,
            "minItems": lo,
            **({"maxItems": hi} if hi is not None else {}),
        }
        try:
            g = accepts_of(exact_rules("unique", items, lo, hi), "u")
        except HostRefusal as err:
            assert err.kind == "UniqueItemsError", err
            assert not any(
                jsonschema.Draft202012Validator(schema).is_valid(list(c))
                for c in [rng.sample(values + [True, False], k) for k in range(lo, lo + 1) if k <= len(values) + 2]
            )
            continue
        choices = values + [True, False] + ["other"]
        texts = dict(zip(map(json.dumps, choices), HOST.call("valueTexts", choices)))  # each value's one JSON text
        for _ in range(20):
            arr = [rng.choice(choices) for _ in range(rng.randint(0, 5))]
            text = "[" + ", ".join(texts[json.dumps(v)] for v in arr) + "]"
            want = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
            assert g(text) == want, (schema, text)
            checked += 1
            accepted += want
    report(
        f"uniqueItems: 60 random arrays of enums, consts and booleans, {checked} arrays: the grammar accepts the "
        f"{accepted} jsonschema validates and no other"
    )


# ---- string formats ------------------------------------------------------------------------------

OPENAI_FORMATS = ["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"]
FORMAT_SAMPLES = {  # (valid, invalid)
    "date": (
        ["2024-02-29", "2000-02-29", "2023-02-28", "2023-12-31", "0001-01-01", "1900-02-28"],
        ["2023-02-29", "1900-02-29", "2023-02-31", "2023-04-31", "2023-13-01", "2023-00-10", "2023-1-1", "0000-01-01"],
    ),
    "time": (
        ["00:00:00Z", "23:59:59+01:00", "12:30:00.5-05:30", "08:15:00Z"],
        ["25:00:00Z", "24:00:00Z", "12:60:00Z", "12:00:60Z", "12:00", "12:00:00+24:00", "12:00:00"],
    ),
    "date-time": (
        ["2024-02-29T12:00:00Z", "1999-12-31T23:59:59.123456+14:00"],
        ["2023-02-29T12:00:00Z", "2024-02-29T25:00:00Z", "2024-02-29 12:00:00Z", "2024-02-29T12:00:00"],
    ),
    "ipv4": (
        ["0.0.0.0", "1.2.3.4", "255.255.255.255", "192.168.0.1"],
        ["256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.-1"],
    ),
    "ipv6": (
        ["::", "::1", "2001:db8::1", "1:2:3:4:5:6:7:8", "::ffff:1.2.3.4", "fe80::"],
        ["1:2:3:4:5:6:7:8:9", ":::", "1::2::3", "12345::", "g::1", "fe80::1%eth0"],
    ),
    "hostname": (
        ["example.com", "a", "a-b.c", "localhost", "xn--80ak6aa92e.com", "x" * 62 + ".com"],
        ["-a.com", "a-.com", "a..b", "x" * 64 + ".com", "a_b.com", "a b"],
    ),
    "email": (
        ["a@b.com", "first.last@example.co.uk", "x+tag@mail-host.org"],
        ["@b.com", "a@", "a b@c.com", "a..b@c.com", "a@-b.com", "a@b-.com", "plain"],
    ),
    "uuid": (
        ["123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000"],
        ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400", "zzze4567-e89b-12d3-a456-426614174000"],
    ),
    "duration": (["P1D", "PT1H", "P1Y2M3DT4H5M6S", "P1W", "PT0S"], ["P", "PT", "P1DT", "1D", "P1M1W"]),
    # beyond OpenAI's list
    "uri": (
        ["http://a.com", "https://a.com/b?c=d#e", "mailto:a@b.com", "urn:isbn:123"],
        ["/relative", "http://a b.com", "http://a.com/%zz", "1http://a"],
    ),
    "json-pointer": (["", "/a", "/a~0b", "/a~1"], ["a", "/~2"]),
    "relative-json-pointer": (["0", "1/a", "0#"], ["-1", "01", "a"]),
    "byte": (["", "QUJD", "YWI=", "YQ==", "QUJDRA=="], ["QUJ", "YQ=", "a b", "YQ===", "Y"]),  # ajv-formats' base64
    # a safe subset of each: what every validator accepts (see schema_support.json's format_patterns_about)
    "iso-time": (["12:00:00Z", "23:59:59.5+01:00"], ["24:00:00Z", "12:60:00Z", "noon"]),
    "iso-date-time": (["2024-02-29T12:00:00Z"], ["2023-02-29T12:00:00Z", "2024-02-29 12:00"]),
    "idn-email": (["a@b.com", "x+y@mail-host.org"], ["plain", "@b.com", "a@"]),
    "idn-hostname": (["example.com", "a", "abc-def.org", "x" * 62], ["ab--cd.com", "-a.com", "a-.com", "x" * 64, "a..b"]),
    "uri-reference": (
        ["", "a/b", "/a/b?c=d#e", "https://a.com:8080/x", "../x", "#f", "?q=1"],
        ["a b", "http://a b.com", "%zz", "http://a.com/%zz"],
    ),
    "iri": (["https://a.com", "http://a.b/c?d=e#f"], ["a/b", "http://", "//a.com", "http://a b"]),
    "iri-reference": (["", "a/b", "https://a.com/x#y"], ["a b", "http://a b.com"]),
    "uri-template": (["https://a.com/{id}", "/users/{id}/posts", "/x"], ["/x/{id", "/x/}", "a b"]),
    "url": (["https://example.com", "http://a-b.example.org/x/y"], ["example.com", "https://a", "ftp//a.com", "https://a b.com"]),
    "json-pointer-uri-fragment": (["#", "#/a", "#/a~0b/~1"], ["/a", "#a", "#/~2"]),
    "regex": (["", "abc", "a b_c 12"], ["(", "[a", "a)"]),
}


def test_the_validator_checks_every_format_openai_lists():
    checkers = jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers
    assert set(OPENAI_FORMATS) <= set(checkers), set(OPENAI_FORMATS) - set(checkers)
    assert set(OPENAI_FORMATS) <= set(FORMAT_SAMPLES) == set(SUPPORT["formats"]) | set(SUPPORT["format_patterns"])


def test_formats_let_through_only_strings_both_validators_accept(report):
    """Every sample the grammar accepts is valid for jsonschema (FormatChecker with the format-nongpl
    checkers) and for ajv-formats; the valid samples are all accepted, the invalid all refused."""
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    cases = [
        {"schema": {"type": "string", "format": fmt}, "texts": [json.dumps(t) for t in valid + invalid]}
        for fmt, (valid, invalid) in FORMAT_SAMPLES.items()
    ]
    ajv = run_typescript("ajv_check.ts", {"cases": cases})["out"]
    for (fmt, (valid, invalid)), ajv_ok in zip(FORMAT_SAMPLES.items(), ajv):
        matcher = _get_matcher_from_grammar(
            xgrammar.Grammar.from_ebnf(schema_ebnf(json.dumps(check_schema({"type": "string", "format": fmt}))))
        )
        for text, by_ajv in zip(valid + invalid, ajv_ok):
            accepted = matcher.accept_string(json.dumps(text)) and matcher.is_terminated()
            matcher.reset()
            if accepted:
                assert checker.conforms(text, fmt) and by_ajv, (fmt, text, "accepted but invalid")
            assert accepted == (text in valid), (fmt, text, accepted)
    total = sum(len(v) + len(i) for v, i in FORMAT_SAMPLES.values())
    report(
        f"formats: {len(FORMAT_SAMPLES)} formats, {total} samples (2023-02-29, 25:00:00Z, 256.1.1.1 among them): "
        "the grammar accepts exactly the valid ones, each valid for jsonschema and ajv-formats"
    )


def test_every_format_pattern_admits_only_strings_both_validators_accept(report):
    """Strings sampled from each format pattern (300 a format, seeded; the reference formats' subsets
    included) are valid for jsonschema's FormatChecker and for ajv-formats, and the grammar takes them."""
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    rng = random.Random(33)
    cases = []
    for fmt, pattern in SUPPORT["format_patterns"].items():
        node = HOST.call("parsePattern", pattern)
        texts = sorted({sample(node, rng) for _ in range(300)})
        invalid = [t for t in texts if not checker.conforms(t, fmt)]
        assert not invalid, (fmt, invalid[:5])
        cases.append({"schema": {"type": "string", "format": fmt}, "texts": [json.dumps(t) for t in texts]})
    ajv = run_typescript("ajv_check.ts", {"cases": cases})["out"]
    for case, ok in zip(cases, ajv):
        assert all(ok), (case["schema"]["format"], [t for t, o in zip(case["texts"], ok) if not o][:5])
    for case in cases[-3:]:  # and the grammar accepts what the pattern describes
        matcher = _get_matcher_from_grammar(xgrammar.Grammar.from_ebnf(schema_ebnf(json.dumps(check_schema(case["schema"])))))
        for text in case["texts"][:40]:
            assert matcher.accept_string(text) and matcher.is_terminated(), (case["schema"], text)
            matcher.reset()
    report(
        f"format patterns: {sum(len(c['texts']) for c in cases)} strings sampled from {len(cases)} patterns, "
        "all valid for jsonschema and ajv-formats"
    )


# ---- the keyword table ----------------------------------------------------------------------------


def test_the_docs_list_every_keyword_from_the_shared_table():
    """schema_support.json's keyword table puts each accepted keyword in one row and names the refused
    ones (each refused by name); docs/structured-output.md's table is written from it (ci/gen/schema_table.py --check)."""
    import subprocess
    import sys

    from browser import repo_root

    rows = [k for row in SUPPORT["keyword_table"] for k in row["keywords"]]
    assert len(rows) == len(set(rows)) and set(rows) == set(SUPPORT["keywords"])
    for keyword in SUPPORT["refused"]:
        assert keyword not in SUPPORT["keywords"]
        with pytest.raises(StructuredOutputError, match=re.escape(f"'{keyword}'")):
            check_schema({"type": "object", keyword: {}})
    check = subprocess.run([sys.executable, "ci/gen/schema_table.py", "--check"], cwd=repo_root(), capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
