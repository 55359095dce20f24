"""Structured output and tool calls in the browser engine (Web Worker, WebGPU on SwiftShader).

The schemas of tests/test_structured.py's CPU run, each with its first seed (the CPU run has both; the
browser's decode on SwiftShader is the suite's slowest), validated by ajv in the page
(/runtime/schema-check.js); the same seed must give the same answer as the server's CPU engine.
Random strict-mode schemas run on the tiny random model: validity must not depend on the model.
"""

from __future__ import annotations

import contextlib
import json
import random

import jsonschema
import pytest
import xgrammar
from xgrammar.testing import _get_matcher_from_grammar

from browser import launch, lantern_server
import structured_cases as cases

from lantern.server.protocol import ChatCompletion, ChatCompletionChunk

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build, pytest.mark.slow]


@contextlib.contextmanager
def engine_page(playwright, artifact):
    """The test page with the browser engine loaded on ``artifact`` (WebGPU), served by lantern serve."""
    with lantern_server([artifact.path]) as (base, _):
        browser = launch(playwright)
        page = browser.new_page()
        page.goto(base + "/engine.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        page.evaluate("(m) => load(m)", f"/models/{artifact.path.name}/")
        yield page
        browser.close()


@pytest.fixture(scope="module")
def page(smollm2_q4, playwright):
    with engine_page(playwright, smollm2_q4) as p:
        yield p


@pytest.fixture(scope="module")
def tiny_page(tiny_q4, playwright):
    with engine_page(playwright, tiny_q4) as p:
        yield p


def chat(page, *requests: dict) -> list[dict]:
    return page.evaluate("(reqs) => chat(reqs)", list(requests))


def test_every_schema_validates_in_the_browser_and_answers_as_the_cpu(page, smollm2_q4, report):
    """Every other schema with the first seed (test_structured.py runs every schema with both seeds on the
    CPU, and the parity test compiles every one with the browser's bundle), and the first schema again
    with the second seed: a repeated schema is not compiled again. SmolLM2 decodes at a few tokens a
    second on SwiftShader, so half the schemas halve the test."""
    cpu = cases.cpu_runs(smollm2_q4.path, "tvm")  # the same key as test_structured.py: computed once
    names = list(cases.SCHEMAS)[::2]
    runs = {name: [cases.SEEDS[0]] for name in names} | {names[0]: list(cases.SEEDS)}
    same, total, tokens, tok_s = 0, 0, 0, []
    for name, seeds in runs.items():
        schema = cases.SCHEMAS[name]
        replies = chat(page, *[cases.request(name, seed) for seed in seeds])
        for seed, reply in zip(seeds, replies):
            ChatCompletion.model_validate(reply)
            text = reply["choices"][0]["message"]["content"]
            assert reply["choices"][0]["finish_reason"] == "stop", (name, seed, text)
            assert page.evaluate("([s, t]) => ajvCheck(s, t)", [schema, text]) is None, (name, seed, text)
            same += text == cpu[name, seed]["text"]
            total += 1
            tokens += reply["usage"]["completion_tokens"]
            tok_s.append(reply["usage"]["decode_tokens_per_s"])
    # Same seed, same sampler, logits within ~1e-4 of the CPU's: the answers agree but for rare near-ties.
    assert same >= 0.8 * total, f"{same}/{total} answers equal the CPU engine's"
    report(
        f"structured (browser): {total} generations over {len(names)} schemas, 100% valid (ajv); "
        f"{same}/{total} identical to the CPU engine's for the same seed; {tokens / total:.1f} tokens per answer, "
        f"decode {sorted(tok_s)[len(tok_s) // 2]:.2f} tok/s (median)"
    )
    stats = page.evaluate("engine.stats()")
    assert stats["grammarCache"]["entries"] == len(names)
    assert stats["grammarCache"]["hits"] >= len(cases.SEEDS) - 1  # the repeated schema was not compiled again


def valid_call(page, call: dict, tool: dict) -> bool:
    """The call names ``tool`` and its arguments validate against its parameters schema (ajv)."""
    return (
        call["type"] == "function"
        and call["function"]["name"] == tool["function"]["name"]
        and page.evaluate("([s, t]) => ajvCheck(s, t)", [tool["function"]["parameters"], call["function"]["arguments"]]) is None
    )


def test_tool_calls_required_named_and_round_trip(tiny_page):
    """On the tiny random model: the grammar, not the model, makes each call whole and valid, and the
    engine's tool path is the same for any model (SmolLM2's real tool calls: test_structured.py)."""
    page = tiny_page
    ask = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 plus 3?"}]
    base = {"messages": ask, "tools": cases.TOOLS, "max_tokens": 160}  # room for a random model's 20-character city
    required, named = chat(
        page,
        {**base, "tool_choice": "required", "seed": 1, "parallel_tool_calls": False},
        {**base, "tool_choice": {"type": "function", "function": {"name": "add"}}, "temperature": 0},
    )
    for reply in (required, named):
        ChatCompletion.model_validate(reply)
        assert reply["choices"][0]["finish_reason"] == "tool_calls"
    [call] = required["choices"][0]["message"]["tool_calls"]
    assert valid_call(page, call, {t["function"]["name"]: t for t in cases.TOOLS}[call["function"]["name"]])
    [call] = named["choices"][0]["message"]["tool_calls"]
    assert valid_call(page, call, cases.ADD)

    # the result goes back as a `tool` message; the model then answers in text
    turn = [*ask, named["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"sum": 5})}]
    [final] = chat(page, {"messages": turn, "tools": cases.TOOLS, "tool_choice": "none", "max_tokens": 16, "temperature": 0})
    assert final["choices"][0]["message"]["content"] and not final["choices"][0]["message"].get("tool_calls")

    # streamed: no tag text in the content deltas, the call whole in the last chunk
    [streamed] = chat(page, {**cases.streamed_weather_call(ask), "max_tokens": 160})
    for c in streamed["chunks"]:
        ChatCompletionChunk.model_validate(c)
    assert "<tool_call>" not in streamed["text"] and streamed["finish"] == "tool_calls"
    [delta_call] = streamed["chunks"][-1]["choices"][0]["delta"]["tool_calls"]
    assert valid_call(page, delta_call, cases.WEATHER)


def test_bad_structured_requests_are_rejected_up_front(page):
    for bad, word in cases.BAD_REQUESTS:
        err = page.evaluate(
            "(req) => errorOf(() => engine.chat.completions.create(req))", {"messages": cases.MESSAGES, "max_tokens": 4, **bad}
        )
        assert err and err["name"] == "InvalidRequestError" and word in err["message"], (bad, err)
    stats = page.evaluate("engine.stats()")
    assert stats["queued"] == 0 and stats["kvSequences"] <= 1
    # what a real-world schema's rewrite ignored: said on the answer, as the server says it
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": cases.ANNOTATED}}
    [reply] = chat(page, {"messages": cases.MESSAGES, "max_tokens": 4, "response_format": fmt})
    assert reply["lantern_warnings"] == cases.ANNOTATED_WARNINGS
    # a speculation field the device does not act on: said, in the server's words (request_rules.json)
    [reply] = chat(page, {"messages": cases.MESSAGES, "max_tokens": 4, "speculation": {"mode": "lookup"}})
    assert reply["lantern_warnings"] == [cases.speculation_ignored("webgpu")]


def test_random_strict_schemas_always_give_valid_json_in_the_browser(tiny_page, report):
    """16 random schemas over OpenAI's strict-mode keywords (the server's generator), on the tiny random
    model on WebGPU, max_tokens 256: every finished answer validates with ajv (in the page) and with
    jsonschema (every format checked), and so does one that max_tokens cut and Lantern closed (closing.ts);
    an answer cut where it could not be closed is a prefix the grammar allows."""
    from lantern.server.protocol import ChatCompletionRequest
    from lantern.server.grammars import schema_ebnf
    from lantern.server.structured import request_spec

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    rng = random.Random(18)
    finished = closed = cut = 0
    for k in range(16):
        schema = cases.random_strict_schema(rng)
        req = {
            "messages": cases.MESSAGES,
            "seed": k,
            "temperature": 1.0,
            "max_tokens": 256,
            "response_format": {"type": "json_schema", "json_schema": {"name": f"s{k}", "schema": schema, "strict": True}},
        }
        [reply] = chat(tiny_page, req)
        ChatCompletion.model_validate(reply)
        text, finish = reply["choices"][0]["message"]["content"], reply["choices"][0]["finish_reason"]
        if finish == "length" and not cases.closed_json(text):  # cut where it could not be closed
            parsed = ChatCompletionRequest(**req)
            spec = request_spec(
                parsed.response_format.model_dump(exclude_none=True), [], None, True, parsed.schema_defaults.model_dump()
            )
            assert _get_matcher_from_grammar(xgrammar.Grammar.from_ebnf(schema_ebnf(spec.source))).accept_string(text), (
                schema,
                text,
            )
            cut += 1
            continue
        assert finish in ("stop", "length"), (schema, text, finish)
        assert tiny_page.evaluate("([s, t]) => ajvCheck(s, t)", [schema, text]) is None, (schema, text)
        jsonschema.Draft202012Validator(schema, format_checker=checker).validate(json.loads(text))
        assert reply["usage"]["completion_tokens"] <= 256
        finished += finish == "stop"
        closed += finish == "length"
    assert finished >= 10
    report(
        f"random strict schemas (tiny model, browser, webgpu): 16 schemas: {finished} finished, {closed} closed "
        f"at max_tokens, 100% valid (ajv and jsonschema with format checks); {cut} cut by max_tokens "
        "(finish_reason length)"
    )
