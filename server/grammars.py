"""xgrammar on the server: grammar specs (structured.py) compiled against the model's vocabulary, and
the token mask of one generation; the twin of webruntime/src/grammars.ts (xgrammar 0.1.27 on both
sides). At every step the mask removes the tokens the grammar forbids before the sampler chooses.

Two builds of xgrammar answer (xgrammar_wasm.build_name()): its native core where it can be had
(xgrammar_core.py: the package's C++ bindings, without torch), else its wasm build in V8, the
browser's (xgrammar_wasm.py).
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from ..errors import LanternError
from .schema_host import HostRefusal
from .structured import COMPILE_LIMITS, GrammarSpec, StructuredOutputError, ask_host
from . import xgrammar_core
from .xgrammar_wasm import WasmTokenMask, WasmXgrammar, allowed_tokens, build_name

# The JSON texts the grammar allows: one line, OpenAI's separators (no runs of whitespace to loop on).
JSON_LAYOUT: dict[str, Any] = {"any_whitespace": False, "indent": None, "separators": (", ", ": "), "strict_mode": True}


@functools.cache
def _placeholder() -> re.Pattern:
    """structured.ts's placeholderPattern: where xgrammar printed a placeholder (group 1: its key)."""
    return re.compile(ask_host("constants")["placeholderPattern"])


def with_exact_rules(ebnf: str) -> str:
    """xgrammar's printed grammar with every placeholder replaced by its exact rules (structured.ts's withExactRules).
    Only the placeholders go to V8: a large schema's grammar is megabytes (1.5 MB for a Kubernetes one, 40 ms
    through mini-racer each way)."""
    keys = [m[1] for m in _placeholder().finditer(ebnf)]
    if not keys:
        return ebnf
    out = ask_host("exactRuleSet", keys)
    text = _placeholder().sub(lambda m: out["names"][m[1]], ebnf)
    return text.rstrip("\n") + "\n" + "\n".join(out["rules"]) + "\n"


def schema_ebnf(source: str) -> str:
    """The EBNF grammar of a checked schema (JSON text) in JSON_LAYOUT, placeholders swapped for their
    exact rules. The twin of structured.ts's ``schemaEbnf``."""
    return with_exact_rules(xgrammar_core.schema_grammar(source, JSON_LAYOUT))


def tight_structural_tag(source: str) -> str:
    """A structural tag with each ``json_schema`` content replaced by that schema's grammar in
    JSON_LAYOUT. xgrammar's structural tags put free whitespace inside JSON, where a small model can
    loop until max_tokens (a tool call's arguments did, 64 of 64 tokens); response_format's JSON has
    none. The twin of structured.ts's ``tightStructuralTag``."""

    def visit(node):
        if isinstance(node, list):
            return [visit(v) for v in node]
        if not isinstance(node, dict):
            return node
        if node.get("type") == "json_schema" and "json_schema" in node:
            return {"type": "grammar", "grammar": schema_ebnf(json.dumps(node["json_schema"]))}
        return {k: visit(v) for k, v in node.items()}

    return json.dumps(visit(json.loads(source)))


def _engine_message(err: Exception) -> str:
    """xgrammar's error without its C++ source location."""
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(err).strip()).splitlines()[0]


class GrammarCompileFault(LanternError):
    """A compile past the safety net in seconds: the machine's fault, not the schema's (HTTP 503)."""


def compiled_text(spec: GrammarSpec) -> str:
    """What xgrammar compiles for a spec: a json_schema's EBNF (placeholders swapped), an ebnf spec's own
    text, a structural tag's tight form (the twin of structured.ts's compiledText)."""
    if spec.kind == "json_schema":
        return schema_ebnf(spec.source)
    return spec.source if spec.kind == "ebnf" else tight_structural_tag(spec.source)


def vocabulary(tokenizer_json: dict, vocab_size: int) -> list[str]:
    """Each token id's text as tokenizer.json stores it (added tokens included; "" where the model's rows
    outnumber the tokenizer's): what xgrammar's TokenizerInfo reads."""
    vocab = [""] * vocab_size
    for token, i in tokenizer_json["model"]["vocab"].items():
        vocab[i] = token
    for t in tokenizer_json.get("added_tokens", []):
        vocab[t["id"]] = t["content"]
    return vocab


class GrammarCompiler:
    """One per model: the vocabulary for xgrammar and a cache of compiled grammars by spec.

    ``build`` is the xgrammar build (xgrammar_wasm.build_name(): the native core where it can be had,
    else its wasm build in V8, the browser's). What may be compiled was decided with the spec
    (grammar_size, the same on every machine and in the browser); a compile that takes longer than
    ``limits["seconds"]`` (a safety net far above that) answers 503 and keeps its result for a retry.
    The cache holds at most ``limits["cache_megabytes"]`` of compiled grammars (the native build's
    sizes; the wasm build reports none, so there at most WASM_CACHE_GRAMMARS), least recently used
    out first."""

    WASM_CACHE_GRAMMARS = 64

    def __init__(
        self,
        tokenizer_json: dict,
        token_postproc: str,
        vocab_size: int,
        stop_ids: list[int],
        limits: dict = COMPILE_LIMITS,
        build: str | None = None,
    ):
        self.build = build or build_name()
        self._cache: OrderedDict[GrammarSpec, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.limits = limits
        self.vocab_size = vocab_size
        self.hits = 0
        if self.build == "wasm":
            self._wasm = WasmXgrammar(tokenizer_json, token_postproc, vocab_size, stop_ids)
            return
        self._compiler = xgrammar_core.Compiler(vocabulary(tokenizer_json, vocab_size), token_postproc, vocab_size, stop_ids)

    def _cached(self, spec: GrammarSpec):
        with self._lock:
            if spec not in self._cache:
                return None
            self.hits += 1
            self._cache.move_to_end(spec)
            return self._cache[spec]

    def _keep(self, spec: GrammarSpec, compiled) -> None:
        with self._lock:
            self._cache[spec] = compiled
            budget = self.limits["cache_megabytes"] * 2**20
            while len(self._cache) > 1 and (
                sum(c.memory_size_bytes for c in self._cache.values()) > budget
                or (self.build == "wasm" and len(self._cache) > self.WASM_CACHE_GRAMMARS)
            ):
                _, dropped = self._cache.popitem(last=False)
                if self.build == "wasm":
                    dropped.release()

    def compile(self, spec: GrammarSpec):
        hit = self._cached(spec)
        if hit is not None:
            return hit
        what = {"json_schema": "JSON schema", "ebnf": "EBNF grammar"}.get(spec.kind, "grammar")
        start = time.perf_counter()
        compiled: Any  # xgrammar.CompiledGrammar, or a WasmGrammar
        if self.build == "wasm":
            try:  # grammars.ts's compile: the browser's text, checks and messages
                compiled = self._wasm.compile(spec.kind, spec.source)
            except HostRefusal as err:
                raise StructuredOutputError(str(err)) from None
        else:
            try:
                text = compiled_text(spec)
                if spec.kind == "structural_tag":
                    compiled = self._compiler.structural_tag(text)
                else:
                    compiled = self._compiler.grammar(text)
            except Exception as err:  # noqa: BLE001 (xgrammar raises RuntimeError and its own types alike)
                raise StructuredOutputError(f"invalid {what}: {_engine_message(err)}") from None
        seconds = time.perf_counter() - start
        self._keep(spec, compiled)
        if seconds > self.limits["seconds"]:
            raise GrammarCompileFault(
                f"compiling the grammar took {seconds:.1f} s, over the server's limit of "
                f"{self.limits['seconds']} s (the machine is busy); it is kept: retry"
            )
        return compiled

    def matcher(self, compiled) -> Mask:
        if self.build == "wasm":
            return self._wasm.matcher(compiled, self.vocab_size)
        return TokenMask(compiled, self.vocab_size)


class TokenMask:
    """The grammar state of one generation: which tokens may come next."""

    def __init__(self, compiled, vocab_size: int):
        self._matcher = xgrammar_core.Matcher(compiled, vocab_size)
        self.vocab_size = vocab_size

    def allowed(self) -> np.ndarray:
        """A boolean array over the vocabulary: True where the grammar allows the token."""
        return allowed_tokens(self._matcher.fill(), self.vocab_size)

    def forced_text(self) -> str:
        """The text the grammar allows next and nothing else (a key, its punctuation), maybe empty."""
        return self._matcher.forced_text()

    def rollback(self, tokens: int) -> None:
        """Undo the last ``tokens`` accepted tokens."""
        self._matcher.rollback(tokens)

    def accept(self, token: int) -> None:
        if not self._matcher.accept(token):
            raise LanternError(f"internal: the grammar rejected token {token} it allowed")


# the grammar state of one generation, in either xgrammar build
Mask = TokenMask | WasmTokenMask
