"""The structured-output suite both runtimes run: 15 JSON schemas over the features users rely on.

Values are kept small (short strings, integer ranges, few items) so a generation is a few dozen
tokens. Each schema runs with two seeds in both runtimes (the browser on SwiftShader), and the two
engines' answers for a seed agree (but for rare near-ties).
"""

from __future__ import annotations

import functools
import json

POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}, "y": {"type": "integer", "minimum": -5, "maximum": 5}},
    "required": ["x", "y"],
}


def obj(required: list[str] | None = None, **props) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required}


SCHEMAS: dict[str, dict] = {
    "flat_required": obj(name={"type": "string", "maxLength": 8}, age={"type": "integer", "minimum": 0, "maximum": 99}),
    "enum": obj(color={"enum": ["red", "green", "blue"]}),
    "optional_field": obj(["ok"], ok={"type": "boolean"}, note={"type": "string", "maxLength": 6}),
    "nested_object": obj(user=obj(id={"type": "integer", "minimum": 1, "maximum": 9}, admin={"type": "boolean"})),
    "array_min_max": obj(
        tags={"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3, "uniqueItems": True}
    ),
    "array_of_objects": {
        "type": "array",
        "items": obj(x={"type": "integer", "minimum": 0, "maximum": 9}),
        "minItems": 2,
        "maxItems": 2,
    },
    "any_of": obj(value={"anyOf": [{"type": "integer", "minimum": 0, "maximum": 50}, {"type": "boolean"}]}),
    "ref_defs": {**obj(a={"$ref": "#/$defs/point"}, b={"$ref": "#/$defs/point"}), "$defs": {"point": POINT}},
    "string_pattern": obj(code={"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}),
    "format_date": obj(day={"type": "string", "format": "date"}),
    "format_ipv4": obj(host={"type": "string", "format": "ipv4"}),
    "number_bounds": obj(
        price={"type": "number", "exclusiveMinimum": 0, "maximum": 999.99},
        celsius={"type": ["number", "null"], "minimum": -40.5, "exclusiveMaximum": 50},
        qty={"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10, "multipleOf": 2},
    ),
    "const_and_null_enum": obj(version={"const": 2}, mode={"enum": ["fast", "safe", None]}),
    "one_of_tagged": {
        "oneOf": [
            obj(kind={"const": "cat"}, lives={"type": "integer", "minimum": 1, "maximum": 9}),
            obj(kind={"const": "dog"}, good={"type": "boolean"}),
        ]
    },
    "tuple_prefix_items": {
        "type": "array",
        "prefixItems": [{"type": "string", "maxLength": 4}, {"type": "integer", "minimum": 0, "maximum": 9}],
        "items": False,
    },
}

SEEDS = (1, 2)
MESSAGES = [
    {"role": "system", "content": "Reply with JSON only."},
    {"role": "user", "content": "Fill in the JSON for a small example."},
]
SAMPLING = {"temperature": 0.8, "max_tokens": 48}


def request(name: str, seed: int) -> dict:
    """The chat request for schema ``name`` with ``seed`` (the same in both runtimes)."""
    return {
        "messages": MESSAGES,
        "seed": seed,
        **SAMPLING,
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}},
    }


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": obj(city={"type": "string", "maxLength": 20}, unit={"enum": ["celsius", "fahrenheit"]}),
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": obj(
            a={"type": "integer", "minimum": 0, "maximum": 100}, b={"type": "integer", "minimum": 0, "maximum": 100}
        ),
    },
}
TOOLS = [WEATHER, ADD]

# Requests each engine must reject up front, and a word the error must contain.
# A draft-04 schema with a vendor keyword and an allOf: answered, with lantern_warnings naming what was
# ignored, by both runtimes.
ANNOTATED = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "type": "object",
    "x-order": 1,
    "allOf": [
        {"properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
        {
            "properties": {"population": {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 100000000}},
            "required": ["population"],
        },
    ],
}
ANNOTATED_WARNINGS = ["ignored the unknown keyword 'x-order' at #"]

BAD_REQUESTS = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}}, "wat"),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True, "minItems": 2}},
            }
        },
        "uniqueItems",
    ),  # strings cannot be listed
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}},
            }
        },
        "'type' at #/properties/a",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/gone"}}}},
            }
        },
        "points to nothing",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "number", "multipleOf": 0.1}},
            }
        },
        "multipleOf",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}},
            }
        },
        "pattern",
    ),
    ({"response_format": {"type": "json_object", "schema": "{not json"}}, "not valid JSON"),
    ({"response_format": {"type": "grammar", "grammar": 'root ::= "a" | '}}, "EBNF"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ({"tool_choice": "required"}, "tools"),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "patternProperties": {"^[^a]+$": {"type": "integer"}}}},
            }
        },
        "patternProperties",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "format": "uri-reference", "pattern": "^a"}},
            }
        },
        "combined with format",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "number", "minimum": 5, "exclusiveMaximum": 5}},
            }
        },
        "exclusiveMaximum",
    ),
]


@functools.cache
def cpu_runs(artifact_path, engine: str = "tvm") -> dict[tuple[str, int], dict]:
    """Every (schema, seed) of the suite through one of the server's engines: text, finish, tokens.

    Cached (pass ``engine`` explicitly: the cache keys on the arguments as given): the CPU test
    checks them and the browser test compares its own answers with the tvm engine's (the same
    library, compiled for WebGPU).
    """
    from lantern.server.engine import Generator, Stop
    from lantern.server.protocol import ChatCompletionRequest
    from lantern.server.structured import request_spec

    generator = Generator(artifact_path, engine)
    out = {}
    for name in SCHEMAS:
        for seed in SEEDS:
            req = ChatCompletionRequest(**request(name, seed))
            grammar = generator.compile_grammar(
                request_spec(req.response_format.model_dump(exclude_none=True), [], None, True, req.schema_defaults.model_dump())
            )
            prompt = generator.encode(generator.render_chat(MESSAGES))
            steps = []
            generator.generate(prompt, req, Stop(), steps.append, grammar=grammar)
            out[name, seed] = {
                "text": "".join(s.delta for s in steps),
                "finish": steps[-1].finish,
                "tokens": steps[-1].usage.completion_tokens,
            }
    generator.close()
    return out


# ---- random schemas over OpenAI's strict-mode keywords ---------------------------------------------

STRICT_FORMATS = ("date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid")


def random_strict_schema(rng, depth: int = 0) -> dict:
    """A random schema as OpenAI's strict mode takes them: objects with every property required and
    additionalProperties false, bounded numbers (exclusive or not, negative, decimal), formats,
    patterns, enums, consts, nullable types, bounded arrays, anyOf, and $defs with a (recursive) $ref."""

    def leaf() -> dict:
        pick = rng.randrange(9)
        if pick < 2:
            kind = rng.choice(["number", "integer"])
            lo, hi = sorted(rng.sample([-50, -1.5, 0, 0.5, 1, 7, 12.75, 100, 1000], 2))
            if kind == "integer" and hi - lo < 3:
                hi = lo + 3
            s = {"type": kind}
            if rng.random() < 0.8:
                s[rng.choice(["minimum", "exclusiveMinimum"])] = lo
            s[rng.choice(["maximum", "exclusiveMaximum"])] = hi
            if rng.random() < 0.3:  # a multiple always lies inside: integers span 3, numbers 1
                s["multipleOf"] = 2 if kind == "integer" else 0.25 if hi - lo >= 1 else 0.125
            return s
        if pick == 2:
            return {"type": "string", "format": rng.choice(STRICT_FORMATS)}
        if pick == 3:
            s = {
                "type": "string",
                "pattern": rng.choice(
                    ["^[A-Z]{2}[0-9]{3}$", "^(yes|no)$", "^[a-z]{1,8}$", "^\\w+( \\w+)*$", "^[^\\s]+@[^\\s]+$"]
                ),
            }
            if rng.random() < 0.5:
                s["maxLength"] = rng.randint(5, 12)
            return s
        if pick == 4:
            return {"enum": rng.sample(["red", "green", "blue", 1, 2.5, None, True], rng.randint(1, 4))}
        if pick == 5:
            return {"const": rng.choice(["v1", 3, False])}
        if pick == 6:
            return {
                "type": [rng.choice(["number", "integer"]), "null"],
                "minimum": rng.choice([0, -1, 5, -40.5, 0.25, -0.001, 18]),
            }
        if pick == 7:
            return {"type": "boolean"}
        return {"type": "string", "maxLength": rng.randint(1, 12)}

    def node(d: int) -> dict:
        pick = rng.random()
        if d >= 2 or pick < 0.5:
            return leaf()
        if pick < 0.7:
            names = rng.sample(["a", "b", "c", "d", "e"], rng.randint(1, 3))
            return {
                "type": "object",
                "properties": {n: node(d + 1) for n in names},
                "required": names,
                "additionalProperties": False,
            }
        if pick < 0.8:
            lo = rng.randint(0, 2)
            return {"type": "array", "items": node(d + 1), "minItems": lo, "maxItems": lo + rng.randint(0, 2)}
        if pick < 0.85:
            return {
                "type": "array",
                "items": {"enum": rng.sample(["x", "y", "z", 1, True], 3)},
                "uniqueItems": True,
                "maxItems": rng.randint(1, 3),
            }
        return {"anyOf": [node(d + 1), node(d + 1)]}

    names = rng.sample(["id", "name", "price", "when", "tags", "score", "next"], rng.randint(2, 4))
    props = {n: node(1) for n in names}
    schema = {"type": "object", "properties": props, "required": names, "additionalProperties": False}
    if rng.random() < 0.3:  # a recursive $ref: a linked list of bounded integers
        schema["$defs"] = {
            "item": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer", "minimum": -3, "maximum": 3},
                    "next": {"anyOf": [{"$ref": "#/$defs/item"}, {"type": "null"}]},
                },
                "required": ["v", "next"],
                "additionalProperties": False,
            }
        }
        props["list"] = {"$ref": "#/$defs/item"}
        schema["required"] = [*names, "list"]
    return schema


def closed_json(text: str) -> bool:
    """Whether an answer cut by max_tokens was closed (closing.py, closing.ts): it parses as JSON."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def streamed_weather_call(messages: list[dict]) -> dict:
    """A streamed request that must call get_weather (greedy, 48 tokens): the call comes whole in the last chunk."""
    return {
        "messages": messages,
        "tools": [WEATHER],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 48,
        "stream": True,
    }


def speculation_ignored(device: str) -> str:
    """The warning a browser device gives a request whose speculation field it does not act on."""
    from lantern import request_rules

    why = f"the {device} device does not speculate yet (lantern serve's llamacpp engine does)"
    return request_rules.message("speculation_ignored", why=why)
