"""The structured-output suite both engines run: 15 JSON schemas over the features users rely on.

Values are kept small (short strings, integer ranges, few items) so a generation is a few dozen
tokens. Each schema runs with two seeds in both engines (the browser on SwiftShader), and the two
engines' answers for a seed agree (but for rare near-ties).
"""

from __future__ import annotations

import functools

POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5},
                                          "y": {"type": "integer", "minimum": -5, "maximum": 5}},
         "required": ["x", "y"]}


def obj(required: list[str] | None = None, **props) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required}


SCHEMAS: dict[str, dict] = {
    "flat_required": obj(name={"type": "string", "maxLength": 8},
                         age={"type": "integer", "minimum": 0, "maximum": 99}),
    "enum": obj(color={"enum": ["red", "green", "blue"]}),
    "optional_field": obj(["ok"], ok={"type": "boolean"}, note={"type": "string", "maxLength": 6}),
    "nested_object": obj(user=obj(id={"type": "integer", "minimum": 1, "maximum": 9}, admin={"type": "boolean"})),
    "array_min_max": obj(tags={"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}),
    "array_of_objects": {"type": "array", "items": obj(x={"type": "integer", "minimum": 0, "maximum": 9}),
                         "minItems": 2, "maxItems": 2},
    "any_of": obj(value={"anyOf": [{"type": "integer", "minimum": 0, "maximum": 50}, {"type": "boolean"}]}),
    "ref_defs": {**obj(a={"$ref": "#/$defs/point"}, b={"$ref": "#/$defs/point"}), "$defs": {"point": POINT}},
    "string_pattern": obj(code={"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}),
    "format_date": obj(day={"type": "string", "format": "date"}),
    "format_ipv4": obj(host={"type": "string", "format": "ipv4"}),
    "number_bounds": obj(price={"type": "number", "minimum": 0},
                         qty={"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}),
    "const_and_null_enum": obj(version={"const": 2}, mode={"enum": ["fast", "safe", None]}),
    "one_of_tagged": {"oneOf": [obj(kind={"const": "cat"}, lives={"type": "integer", "minimum": 1, "maximum": 9}),
                                obj(kind={"const": "dog"}, good={"type": "boolean"})]},
    "tuple_prefix_items": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 4},
                                                            {"type": "integer", "minimum": 0, "maximum": 9}],
                           "items": False},
}

SEEDS = (1, 2)
MESSAGES = [{"role": "system", "content": "Reply with JSON only."},
            {"role": "user", "content": "Fill in the JSON for a small example."}]
SAMPLING = {"temperature": 0.8, "max_tokens": 48}


def request(name: str, seed: int) -> dict:
    """The chat request for schema ``name`` with ``seed`` (the same in both engines)."""
    return {"messages": MESSAGES, "seed": seed, **SAMPLING,
            "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name],
                                                                       "strict": True}}}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": obj(city={"type": "string", "maxLength": 20}, unit={"enum": ["celsius", "fahrenheit"]})}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": obj(a={"type": "integer", "minimum": 0, "maximum": 100},
                      b={"type": "integer", "minimum": 0, "maximum": 100})}}
TOOLS = [WEATHER, ADD]

# Requests each engine must reject up front, and a word the error must contain.
BAD_REQUESTS = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}},
     "wat"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "uniqueItems": True}}}}, "uniqueItems"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "multipleOf": 3}}}}, "multipleOf"),
    ({"response_format": {"type": "json_object", "schema": "{not json"}}, "not valid JSON"),
    ({"response_format": {"type": "grammar", "grammar": 'root ::= "a" | '}}, "EBNF"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ({"tool_choice": "required"}, "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "format": "time"}}}}, "format"),
]


@functools.cache
def cpu_runs(artifact_path, engine: str = "tvm") -> dict[tuple[str, int], dict]:
    """Every (schema, seed) of the suite through one of the server's engines: text, finish, tokens.

    Cached (pass ``engine`` explicitly: the cache keys on the arguments as given): the CPU test
    checks them and the browser test compares its own answers with the tvm engine's (the same
    library, compiled for WebGPU).
    """
    import threading

    from lantern.server.engine import ModelEngine
    from lantern.server.protocol import ChatCompletionRequest
    from lantern.server.structured import request_spec

    engine = ModelEngine(artifact_path, engine)
    out = {}
    for name in SCHEMAS:
        for seed in SEEDS:
            req = ChatCompletionRequest(**request(name, seed))
            grammar = engine.compile_grammar(request_spec(req.response_format.model_dump(exclude_none=True), [], None,
                                                          True))
            prompt = engine.encode(engine.render_chat(MESSAGES))
            steps = []
            engine.generate(prompt, req, threading.Event(), steps.append, grammar=grammar)
            out[name, seed] = {"text": "".join(s.delta for s in steps), "finish": steps[-1].finish,
                               "tokens": steps[-1].usage.completion_tokens}
    engine.close()
    return out
