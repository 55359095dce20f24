"""One corpus of chat requests, valid and invalid, at and beyond the edges of every rule of
compiler/contracts/request_rules.json, sent to `lantern serve` over HTTP and to the browser engine's own
Engine.validate under Node (webruntime/src/request_rules.ts): the same accept/reject decisions, the same
messages and the same defaults. No model is needed: the server serves none, so a request that passes
its rules is answered "model not found", and the browser engine is only a manifest."""

from __future__ import annotations

import http.client
import json

import pytest

from browser import lantern_server
from test_structured import run_typescript

from lantern import request_rules
from lantern.server.app import ServerConfig
from lantern.server.engine import InvalidRequest, sampling_params
from lantern.server.protocol import ChatCompletionRequest

VOCAB = 1000  # the model the sampler's vocabulary check assumes
RULES = request_rules.RULES
MESSAGES = [{"role": "user", "content": "hi"}]
WRONG_TYPES = ["x", 5, 1.5, True, [], {}]
CALL = {"id": "c1", "function": {"name": "f", "arguments": "{}"}}


def example(rule: dict):
    """A value the rule accepts."""
    kind = rule["type"]
    if kind == "object":
        fields = rule.get("fields", {})
        return {name: example(r) for name, r in fields.items() if r.get("required")}
    if kind == "array":
        return [example(rule["items"])] * max(1, rule.get("min_items", 0)) if "items" in rule else []
    if kind in ("number", "integer"):
        return rule["min"]
    if kind == "enum":
        return rule["values"][0]
    return {"string": "x", "strings": "x", "boolean": True, "token_map": {}}[kind]


def edges(rule: dict) -> list:
    """Values at and beyond the rule's edges, valid and invalid (nested rules' edges in place)."""
    kind = rule["type"]
    others = [v for v in WRONG_TYPES if not _same_kind(kind, v)]  # the wrong types
    if kind in ("number", "integer"):
        lo, hi = rule["min"], rule.get("max")
        near = [lo, lo - 1e-3, float(lo)] + ([hi, hi + 1e-3] if hi is not None else [lo + 10**6])
        if kind == "integer":
            near += [lo - 1, lo + 0.5, lo + 1e-5] + ([hi + 1] if hi is not None else [])
        return near + others + ["1"]
    if kind == "string":
        return others + ["", "x" * 50]
    if kind == "enum":
        return rule["values"] + ["bogus", "x" * 50] + others
    if kind == "strings":
        n = rule["max_items"]
        return ["", "a", [], ["a"] * n, ["a"] * (n + 1), ["a", ""], [5], {}, 5]
    if kind == "token_map":
        lo, hi = rule["value"]["min"], rule["value"]["max"]
        return [
            {},
            {"5": lo},
            {"5": hi},
            {"5": hi + 1},
            {"5": "1"},
            {"5": None},
            {"x": 1},
            {"-1": 1},
            {"0x1": 1},
            {"10": hi + 1, "2": hi + 1},
            {str(VOCAB - 1): 1},
            {str(VOCAB): 1},
            [],
        ]
    if kind == "array":
        out = others + ([[]] if rule.get("min_items") else [])
        if "items" in rule:
            out += [[v] for v in edges(rule["items"])]
        return out
    if kind == "object":
        base, fields = example(rule), rule.get("fields", {})
        out = others + [base]
        for name, r in fields.items():
            out += [{**base, name: v} for v in edges(r) + [None]]
            if r.get("required"):
                out.append({k: v for k, v in base.items() if k != name})
            if r.get("optional_for_roles"):  # without the field, for every role
                out += [{"role": role} for role in fields["role"]["values"]]
        return out
    return [True, False] + others  # boolean


def _same_kind(kind: str, v) -> bool:
    if isinstance(v, bool):
        return kind == "boolean"
    if isinstance(v, (int, float)):
        return kind in ("number", "integer")
    if isinstance(v, str):
        return kind in ("string", "enum", "strings")
    return kind in (("object", "token_map") if isinstance(v, dict) else ("array", "strings"))


def corpus() -> list:
    """Each field of the table at each of its edges (and null, and absent when it is required) in an
    otherwise valid request, then the cases named below."""
    reqs: list = []
    base = {"messages": MESSAGES}
    for section in (RULES["endpoints"]["chat"], RULES["shared"]):
        for name, rule in section.items():
            for value in edges(rule) + [None]:
                req = {**base, name: value}
                need = rule.get("requires")
                reqs += [req, {**req, need["field"]: need["value"]}] if need else [req]
            if rule.get("required"):
                reqs.append({k: v for k, v in base.items() if k != name})
    reqs += [
        # the drifts the table ended: developer messages, a fifth stop string, include_usage's default
        {"messages": [{"role": "developer", "content": "Be brief."}, *MESSAGES]},
        {"messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]},
        {"messages": MESSAGES, "stream": True},
        {"messages": MESSAGES, "stream": True, "stream_options": {}},
        {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
        # the first broken rule in the table's order is the one reported
        {"messages": [], "temperature": 5},
        {"messages": MESSAGES, "temperature": 5, "top_p": 5},
        {"messages": [{"role": "bogus"}, {"role": "user"}]},
        # numbers as JavaScript prints them; long values by their kind
        {"messages": MESSAGES, "temperature": 1e21},
        {"messages": MESSAGES, "temperature": 1e-7},
        {"messages": MESSAGES, "top_k": 2.5e-7},
        {"messages": MESSAGES, "top_k": 1e20 + 0.5},
        {"messages": MESSAGES, "frequency_penalty": -0.0},
        {"messages": MESSAGES, "seed": 2**53},
        {"messages": MESSAGES, "seed": -(2**53) - 2},
        {"messages": MESSAGES, "stop": ["x" * 30, "y" * 30]},
        {"messages": MESSAGES, "model": "é" * 45},
        {"messages": MESSAGES, "model": ["😀"] * 8},
        {"messages": MESSAGES, "stop": {"a": '\n\t"é\\'}},
        # fields the table does not know pass (tools and response_format are structured.py's and .ts's)
        {"messages": MESSAGES, "user": "u1", "metadata": {"a": None}},
        {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
        {"messages": MESSAGES, "max_tokens": 5, "max_completion_tokens": 7},
        {
            "messages": [
                *MESSAGES,
                {"role": "assistant", "tool_calls": [CALL]},
                {"role": "tool", "content": "4", "tool_call_id": "c1"},
            ]
        },
        # not an object
        [],
        "hi",
        5,
    ]
    return reqs


def server_answers(requests: list) -> list[tuple[int, dict]]:
    """(status, error body) of each request to `lantern serve` serving no model."""
    out = []
    with lantern_server(ServerConfig([])) as (base, _):
        host, port = base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        for req in requests:
            conn.request("POST", "/v1/chat/completions", json.dumps(req), {"content-type": "application/json"})
            resp = conn.getresponse()
            out.append((resp.status, json.loads(resp.read())["error"]))
        conn.close()
    return out


def passed_rules(status: int, error: dict) -> bool:
    """Whether the server went past the request's rules: to choosing the model, which it does not serve."""
    return error.get("code") == "model_not_found" or error["message"].startswith("several models are served")


def python_answer(req, status: int, error: dict) -> dict:
    """The server's answer as the browser's is written: an error, or what the engine resolves."""
    if not passed_rules(status, error):
        assert status == 400 and error["type"] == "invalid_request_error", (req, status, error)
        return {"error": f"InvalidRequestError: {error['message']}"}
    m = ChatCompletionRequest.model_validate(req)
    try:
        p = sampling_params(m, VOCAB, {})  # what the server checks next, with a model of VOCAB tokens
    except InvalidRequest as err:
        return {"error": f"InvalidRequestError: {err}"}
    return {
        "resolved": {
            "stream": m.stream,
            "include_usage": m.stream_options.include_usage,
            "n": m.n,
            "logprobs": m.logprobs,
            "parallel_tool_calls": m.parallel_tool_calls,
            "token_limit": m.token_limit(),
            "stops": m.stop_list(),
            "stop_token_ids": m.stop_token_ids or [],
            "template_messages": request_rules.template_messages([x.model_dump(exclude_none=True) for x in m.messages]),
            "sampling": {
                "temperature": p.temperature,
                "top_p": p.top_p,
                "top_k": p.top_k,
                "repetition_penalty": p.repetition_penalty,
                "frequency_penalty": p.frequency_penalty,
                "presence_penalty": p.presence_penalty,
                "seed": p.seed,
                "top_logprobs": p.top_logprobs,
                "logit_bias": [[k, v] for k, v in sorted(p.logit_bias.items())],
            },
        }
    }


CHAT_CONFIGS = [
    {"eos_token_id": 2},
    {"eos_token_id": [2, 3]},
    {"eos_token_id": None, "conv_template": {"stop_token_ids": [7]}},
    {"conv_template": None},
    {},
    {"eos_token_id": 2, "conv_template": {"stop_token_ids": [2, 9]}},
    {"eos_token_id": "x"},
]
TEMPLATES = [None, "", "{{ messages }}", "{% if tools %}{{ tools | tojson }}{% endif %}"]


@pytest.fixture(scope="module")
def answers():
    requests = corpus()
    ts = run_typescript(
        "request_rules.ts",
        {
            "vocab": VOCAB,
            "requests": requests,
            "chat_configs": CHAT_CONFIGS,
            "templates": TEMPLATES,
            "embedding_requests": EMBEDDING_REQUESTS,
        },
    )
    server = server_answers(requests)
    return requests, server, [python_answer(req, *answer) for req, answer in zip(requests, server)], ts


def test_both_runtimes_answer_every_request_alike(answers, report):
    requests, server, py, ts = answers
    assert len(ts["answers"]) == len(requests)
    for req, mine, theirs in zip(requests, py, ts["answers"]):
        assert mine == theirs, req
    refused = sum("error" in a for a in py)
    line = (
        f"request rules: {len(requests)} requests ({refused} refused, {len(requests) - refused} accepted), "
        "the same decisions, messages and defaults from lantern serve and the browser engine"
    )
    print(line)
    report(line)
    # every field of the table was refused (the server's `param` names it) and accepted somewhere
    params = {(error.get("param") or "").split(".")[0].split("[")[0] for _, error in server}
    for section in (RULES["endpoints"]["chat"], RULES["shared"]):
        for name in section:
            assert name in params, name
            assert any("resolved" in a and isinstance(r, dict) and r.get(name) is not None for r, a in zip(requests, py)), name


def test_the_drifts_are_gone(answers):
    requests, _, py, _ = answers
    by_request = {json.dumps(r, sort_keys=True): a for r, a in zip(requests, py)}
    get = lambda req: by_request[json.dumps(req, sort_keys=True)]  # noqa: E731
    developer = get({"messages": [{"role": "developer", "content": "Be brief."}, *MESSAGES]})
    assert developer["resolved"]["template_messages"][0] == {"role": "system", "content": "Be brief."}
    assert get({"messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]}) == {
        "error": "InvalidRequestError: stop must be a string or an array of at most 4 non-empty strings, "
        'got ["a","b","c","d","e"]'
    }
    assert get({"messages": MESSAGES, "stream": True})["resolved"]["include_usage"] is False
    assert get({"messages": MESSAGES, "temperature": 1e21}) == {
        "error": "InvalidRequestError: temperature must be a number in [0, 2], got 1e+21"
    }


def test_artifact_facts_are_read_alike(answers):
    *_, ts = answers
    assert ts["stop_token_ids"] == [sorted(request_rules.stop_token_ids(c)) for c in CHAT_CONFIGS]
    assert ts["stop_token_ids"][1] == [2, 3] and ts["stop_token_ids"][5] == [2, 9]
    knows = [request_rules.template_knows_tools(t) for t in TEMPLATES]
    assert ts["knows_tools"] == knows == [False, False, False, True]


@pytest.mark.parametrize(
    "value",
    [
        0,
        1,
        -1,
        0.5,
        2.0,
        1e-7,
        1.5e-7,
        1e21,
        1.5e21,
        123456789012345680000.0,
        1e300,
        -2.5e-12,
        2**53,
        2**60,
        0.1 + 0.2,
        1e16,
        1e-6,
    ],
)
def test_numbers_are_written_as_javascript_writes_them(value):
    js = {
        0: "0",
        1: "1",
        -1: "-1",
        0.5: "0.5",
        2.0: "2",
        1e-7: "1e-7",
        1.5e-7: "1.5e-7",
        1e21: "1e+21",
        1.5e21: "1.5e+21",
        123456789012345680000.0: "123456789012345680000",
        1e300: "1e+300",
        -2.5e-12: "-2.5e-12",
        2**53: "9007199254740992",
        2**60: "1152921504606847000",
        0.1 + 0.2: "0.30000000000000004",
        1e16: "10000000000000000",
        1e-6: "0.000001",
    }
    assert request_rules.show(value) == js[value]


def test_completions_take_the_shared_rules_and_their_own():
    from pydantic import ValidationError

    from lantern.server.protocol import CompletionRequest

    with pytest.raises(ValidationError, match="prompt is required"):
        CompletionRequest.model_validate({})
    with pytest.raises(ValidationError, match=r"only n=1 is supported, got 2"):
        CompletionRequest.model_validate({"prompt": "x", "n": 2})
    assert CompletionRequest.model_validate({"prompt": "x", "echo": None}).echo is False


# /v1/embeddings bodies at the edges of the `embeddings` endpoint's rules (which take no shared field)
EMBEDDING_REQUESTS = (
    [
        {"input": value, **extra}
        for value in [
            "x",
            "",
            ["a", "b"],
            ["a", ""],
            [1, 2, 3],
            [[1, 2], [3]],
            [[1], []],
            [],
            [-1],
            [1.5],
            [1.0],
            [True],
            5,
            None,
            {},
        ]
        + [["a"] * 2048, ["a"] * 2049, list(range(3000)), [[1]] * 2049]
        for extra in [{}]
    ]
    + [
        {"input": "x", **extra}
        for extra in [
            {"dimensions": 1},
            {"dimensions": 0},
            {"dimensions": 2.0},
            {"dimensions": "8"},
            {"encoding_format": "base64"},
            {"encoding_format": "int8"},
            {"truncate": True},
            {"truncate": 1},
            {"model": 5},
            {"user": "u"},
            {"temperature": 5},  # a shared (chat) field: not an embeddings rule, kept as sent
            {"dimensions": None, "encoding_format": None},
        ]
    ]
    + [{}, [], "x"]
)


def test_embeddings_requests_are_checked_alike(answers):
    """The `embeddings` endpoint's rules (no shared sampling fields) in request_rules.py and
    request_rules.ts: the same decisions, messages and defaults."""
    ts = answers[3]["embedding_answers"]
    assert len(ts) == len(EMBEDDING_REQUESTS)
    refused = 0
    for req, theirs in zip(EMBEDDING_REQUESTS, ts):
        try:
            mine = {"resolved": request_rules.checked(req, "embeddings")}
        except request_rules.RuleError as err:
            mine, refused = {"error": f"InvalidRequestError: {err.message}"}, refused + 1
        assert mine == theirs, req
    assert 10 < refused < len(EMBEDDING_REQUESTS) - 10
