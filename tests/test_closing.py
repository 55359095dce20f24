"""Closing a JSON answer that max_tokens cut (lantern/server/closing.py and its browser twin
webruntime/src/closing.ts), on SmolLM2's real tokenizer: the two languages order the vocabulary alike
and close the same cut answers the same way, and what they close validates and fits the budget."""

from __future__ import annotations

import json

import jsonschema
import pytest
from tokenizers import Tokenizer

from test_structured import run_typescript

from lantern.server.closing import HOLD, Closer
from lantern.server.grammars import GrammarCompiler
from lantern.server.structured import response_format_spec

STOPS = [0, 2]  # <|endoftext|>, <|im_end|>
VOCAB = 49152

ITEMS = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
                "required": ["id", "name"],
                "additionalProperties": False,
            },
        },
        "owner": {"type": "string", "enum": ["ops", "research"]},
    },
    "required": ["items", "owner"],
    "additionalProperties": False,
}
CODES = {
    "type": "object",
    "properties": {
        "code": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "score": {"type": "number", "minimum": 5},
    },
    "required": ["code", "tags", "score"],
    "additionalProperties": False,
}
PARTS = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "parts": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+(-[0-9]+)+$"}},
    },
    "required": ["count", "parts"],
    "additionalProperties": False,
}
# answers as Lantern writes JSON (one line, OpenAI's separators, the schema's key order), to be cut
LONG = {
    "items": (ITEMS, json.dumps({"items": [{"id": i, "name": f"item number {i}"} for i in range(12)], "owner": "ops"})),
    "codes": (CODES, json.dumps({"code": 'a\\"b ' + "7" * 80, "tags": ["x y", "z"], "score": 6.5})),
    "parts": (PARTS, json.dumps({"count": 12345678901234, "parts": [f"part-{i}-{i * 7}" for i in range(12)]})),
}


@pytest.fixture(scope="module")
def vocab(real_tokenizer_dir):
    text = (real_tokenizer_dir / "tokenizer.json").read_text()
    tokenizer = Tokenizer.from_str(text)
    compiler = GrammarCompiler(json.loads(text), "byte_level", VOCAB, STOPS)
    closer = Closer.for_tokenizer(tokenizer, json.loads(text), VOCAB, STOPS)
    return {"text": text, "tokenizer": tokenizer, "compiler": compiler, "closer": closer}


def cut_answers(vocab) -> list[dict]:
    """Each long answer cut at several lengths: within a string, an escape, a number, a pattern, between
    items."""
    cases = []
    for name, (schema, answer) in LONG.items():
        spec = response_format_spec({"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
        ids = vocab["tokenizer"].encode(answer, add_special_tokens=False).ids
        for n in (3, 9, 17, 30, 41, len(ids) - 5):
            cases.append({"schema": schema, "spec": spec, "ids": ids[:n], "maxTokens": n})
    return cases


def test_both_languages_close_cut_answers_alike_and_the_result_validates(vocab, report):
    closer, compiler, tokenizer = vocab["closer"], vocab["compiler"], vocab["tokenizer"]
    cases = cut_answers(vocab)
    closed = []
    for case in cases:
        mask = compiler.matcher(compiler.compile(case["spec"]))
        for token in case["ids"]:
            mask.accept(token)
        closed.append(closer.close(mask, case["ids"], case["maxTokens"]))
    out = run_typescript(
        "closing.ts",
        {
            "tokenizer": vocab["text"],
            "postproc": "byte_level",
            "vocabSize": VOCAB,
            "stopIds": STOPS,
            "cases": [
                {"source": c["spec"].source, "steps": [tokenizer.decode([t]) for t in c["ids"]], "maxTokens": c["maxTokens"]}
                for c in cases
            ],
        },
    )
    assert [list(o) for o in closer.orders] == out["orders"]
    assert [None if c is None else {"kept": c[0], "path": c[1]} for c in closed] == out["closed"]

    done = 0
    for case, found in zip(cases, closed):
        if found is None:
            continue
        kept, path = found
        assert kept + len(path) <= case["maxTokens"] and kept >= case["maxTokens"] - HOLD
        text = tokenizer.decode(case["ids"][:kept] + path)
        jsonschema.Draft202012Validator(case["schema"]).validate(json.loads(text))
        done += 1
    # a few tokens cannot hold any of the objects (SmolLM2 needs 10 and more); every cut from 30 tokens on closes
    assert all(found is None for case, found in zip(cases, closed) if case["maxTokens"] < 10)
    assert all(found for case, found in zip(cases, closed) if case["maxTokens"] >= 30)
    report(
        f"closing: {done} of {len(cases)} cut answers closed within max_tokens, valid; the browser's twin "
        "closed the same ones with the same tokens"
    )


def test_the_wasm_build_of_xgrammar_closes_alike(vocab):
    """lantern serve without the native xgrammar (server/xgrammar_wasm.py) closes every cut answer the same."""
    wasm = GrammarCompiler(json.loads(vocab["text"]), "byte_level", VOCAB, STOPS, build="wasm")
    for case in cut_answers(vocab)[::2]:
        closed = []
        for compiler in (vocab["compiler"], wasm):
            mask = compiler.matcher(compiler.compile(case["spec"]))
            for token in case["ids"]:
                mask.accept(token)
            closed.append(vocab["closer"].close(mask, case["ids"], case["maxTokens"]))
        assert closed[0] == closed[1], case["maxTokens"]


def test_the_policy_ends_strings_and_containers_first(vocab):
    """From inside a free string in an array of objects, the shortest way out is taken: close the string,
    the object and the array, then the required property left (an enum)."""
    closer, compiler, tokenizer = vocab["closer"], vocab["compiler"], vocab["tokenizer"]
    spec = response_format_spec({"type": "json_schema", "json_schema": {"name": "items", "schema": ITEMS}})
    ids = tokenizer.encode('{"items": [{"id": 1, "name": "first', add_special_tokens=False).ids
    mask = compiler.matcher(compiler.compile(spec))
    for token in ids:
        mask.accept(token)
    kept, path = closer.close(mask, ids, len(ids) + 12)
    assert kept == len(ids)
    answer = json.loads(tokenizer.decode(ids + path))
    assert answer["items"] == [{"id": 1, "name": "first"}] and answer["owner"] in ("ops", "research")
