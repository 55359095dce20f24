"""The server's two xgrammar builds agree: the native package (the `xgrammar` extra) and its wasm build
in V8 (server/xgrammar_wasm.py), which a `lantern serve` installed without the extra uses. Along real
answers, tokenized by SmolLM2's tokenizer, every mask, every forced text and every rollback is the same;
refusals carry the same message; the wasm build's cache releases what it drops while a matcher that
still holds the grammar goes on."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer

from lantern.errors import LanternError
from lantern.server import xgrammar_core
from lantern.server.grammars import GrammarCompiler
from lantern.server.structured import StructuredOutputError, request_spec, response_format_spec
from lantern.server.xgrammar_wasm import build_name

VOCAB = 49152
STOPS = [0, 2]  # <|endoftext|>, <|im_end|>

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        "population": {"type": "integer", "minimum": 1, "maximum": 40000000},
        "tags": {"type": "array", "items": {"enum": ["capital", "port", "old"]}, "uniqueItems": True},
        "area": {"type": "number"},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CASES = {
    "json_schema": (
        response_format_spec({"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}),
        json.dumps({"city": "Paris", "population": 2102650, "tags": ["capital", "old"]}),
    ),
    "ebnf": (
        response_format_spec({"type": "grammar", "grammar": 'root ::= "answer: " ("yes" | "no") " (" [0-9]+ "%)"'}),
        "answer: yes (97%)",
    ),
    "tools": (
        request_spec(None, TOOLS, "required", False),
        '<tool_call>{"name": "weather", "arguments": {"city": "Lyon"}}</tool_call>',
    ),
}


@pytest.fixture(scope="module")
def builds(real_tokenizer_dir):
    text = (real_tokenizer_dir / "tokenizer.json").read_text()
    made = {build: GrammarCompiler(json.loads(text), "byte_level", VOCAB, STOPS, build=build) for build in ("native", "wasm")}
    return made, Tokenizer.from_str(text)


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_builds_mask_alike_along_an_answer(builds, case):
    made, tokenizer = builds
    spec, answer = CASES[case]
    native, wasm = (made[b].matcher(made[b].compile(spec)) for b in ("native", "wasm"))
    ids = tokenizer.encode(answer, add_special_tokens=False).ids
    for step, token in enumerate(ids):
        allowed = native.allowed()
        assert np.array_equal(allowed, wasm.allowed()), f"step {step}"
        assert allowed[token] and native.forced_text() == wasm.forced_text()
        native.accept(token)
        wasm.accept(token)
        if step == 3:  # two back and forward again: a speculation's rejected drafts
            native.rollback(2)
            wasm.rollback(2)
            for again in ids[2:4]:
                native.accept(again)
                wasm.accept(again)
    end = native.allowed()
    assert np.array_equal(end, wasm.allowed()) and end[STOPS].all() and end.sum() == len(STOPS)  # complete: only a stop
    with pytest.raises(LanternError, match="rejected token"):
        wasm.accept(ids[0])


def test_both_builds_refuse_alike(builds):
    made, _ = builds
    bad = response_format_spec({"type": "grammar", "grammar": 'root ::= "a" undefined_rule'})
    messages = set()
    for compiler in made.values():
        with pytest.raises(StructuredOutputError, match="^invalid EBNF grammar: ") as err:
            compiler.compile(bad)
        messages.add(str(err.value))
    assert len(messages) == 1, messages


def test_the_wasm_cache_releases_what_it_drops(builds, monkeypatch):
    made, tokenizer = builds
    wasm = made["wasm"]
    monkeypatch.setattr(wasm, "WASM_CACHE_GRAMMARS", 1)
    first, second = (response_format_spec({"type": "grammar", "grammar": f'root ::= "{word}" [0-9]+'}) for word in ("x", "y"))
    held = wasm.matcher(wasm.compile(first))
    wasm.compile(second)  # drops the first grammar; its matcher holds it still
    hits = wasm.hits
    wasm.compile(first)
    assert wasm.hits == hits  # dropped: compiled again
    for token in tokenizer.encode("x2026", add_special_tokens=False).ids:
        assert held.allowed()[token]
        held.accept(token)


def test_the_build_is_chosen_by_rule(monkeypatch):
    monkeypatch.setenv("LANTERN_XGRAMMAR", "wasm")
    assert build_name() == "wasm"
    monkeypatch.setenv("LANTERN_XGRAMMAR", "native")
    assert build_name() == "native"
    monkeypatch.setenv("LANTERN_XGRAMMAR", "fast")
    with pytest.raises(LanternError, match=r"LANTERN_XGRAMMAR='fast': expected one of native, wasm"):
        build_name()
    monkeypatch.delenv("LANTERN_XGRAMMAR")
    assert build_name() == "native"  # the test environment has the package


def test_the_native_core_comes_from_the_package_index_without_torch(tmp_path, monkeypatch):
    """Where xgrammar is not installed, its bindings come from its wheel on the package index (pip
    download, no dependencies), kept in the cache: the very file the package installs. Where pip cannot
    fetch it, the reason is an error the server states before running the wasm build."""
    installed = xgrammar_core._installed()
    assert installed is not None  # the test environment has the package
    fetched = xgrammar_core._cached(tmp_path)
    assert fetched.parent == tmp_path / "wheels" / f"xgrammar-{xgrammar_core.VERSION}"
    assert fetched.read_bytes() == installed.read_bytes() and not list(fetched.parent.glob("*.whl"))
    assert xgrammar_core._cached(tmp_path) == fetched  # kept: not fetched again

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no index, no links: nothing to download from
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(LanternError, match=r"could not download xgrammar==0\.1\.27 \(the grammar engine's core\)"):
        xgrammar_core._cached(tmp_path / "offline")
