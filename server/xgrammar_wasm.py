"""xgrammar's wasm build, run in V8, for a `lantern serve` without xgrammar's native core.

The native core (xgrammar_core.py: the package's bindings, installed or fetched into the cache) runs
where it can be had. Where it cannot (offline, another platform), the server runs the grammar engine the browser
runs: web-xgrammar 0.1.27 (the same C++ core, compiled to wasm), bundled with the structured-output
compiler into webruntime/dist/schema-host.js and driven through grammars.ts, so specs, grammars, error
messages and masks are the browser's, bit for bit (tests/test_xgrammar_wasm.py holds the two builds
equal along real answers).

What differs is speed (docs/benchmarks.md, "Structured output without the native xgrammar"): compiling
a grammar against the vocabulary runs on one thread of wasm, about 15x slower than the native build on
2 cores, and each mask costs a call into V8 (about 8x). One V8 context per model holds the compiler and every matcher, one
call at a time: while a large grammar compiles, the masks of other structured streams wait for it.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import weakref
from typing import Any

import numpy as np

from ..errors import LanternError
from . import xgrammar_core
from .schema_host import BUNDLE, HostRefusal, SchemaHost

BUILDS = ("native", "wasm")
# schema-host.ts's lanternXgrammar
CALLS = ("init", "compile", "matcher", "mask", "accept", "rollback", "forced", "release")


def build_name() -> str:
    """Which xgrammar build the server uses: LANTERN_XGRAMMAR (native or wasm) if set, else the native
    core where it can be had (xgrammar_core.available), else the wasm build."""
    chosen = os.environ.get("LANTERN_XGRAMMAR", "").strip()
    if chosen:
        if chosen not in BUILDS:
            raise LanternError(f"LANTERN_XGRAMMAR={chosen!r}: expected one of {', '.join(BUILDS)}")
        return chosen
    return "native" if xgrammar_core.available() is None else "wasm"


_SHIFTS = np.arange(32, dtype=np.uint32)


def allowed_tokens(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """xgrammar's bitmask as uint32 words (bit i of word i >> 5: token i allowed, in either build), as
    booleans over the vocabulary."""
    bits = (words[:, None] >> _SHIFTS) & 1
    return bits.reshape(-1)[:vocab_size].astype(bool)


def build_description() -> str:
    """The build, as `lantern serve` states it when a model loads."""
    if build_name() == "native":
        return "xgrammar's native build"
    # asked for by name, the native core is not looked for (nor fetched) just to say why not
    why = "LANTERN_XGRAMMAR=wasm" if os.environ.get("LANTERN_XGRAMMAR", "").strip() else xgrammar_core.available()
    return f"xgrammar's wasm build ({why}; the native one compiles grammars ~15x faster)"


class WasmGrammar:
    """A compiled grammar's handle in V8; released when the compiler's cache drops it."""

    # the wasm build reports no size: the cache counts grammars instead (GrammarCompiler._keep)
    memory_size_bytes = 0

    def __init__(self, owner: WasmXgrammar, handle: int):
        self.owner = owner
        self.handle = handle

    def release(self) -> None:
        self.owner.release_later(self.handle)


class WasmXgrammar:
    """One V8 context with the compiler for one model's vocabulary, and its matchers."""

    def __init__(self, tokenizer_json: dict, token_postproc: str, vocab_size: int, stop_ids: list[int]):
        self._host = SchemaHost(BUNDLE)  # a context of its own: a long compile does not hold up schema checks
        self._lock = threading.Lock()
        self._released: collections.deque[int] = collections.deque()
        # only what grammars.ts reads of tokenizer.json (a large vocabulary's file is tens of megabytes)
        vocab = {"model": {"vocab": tokenizer_json["model"]["vocab"]}, "added_tokens": tokenizer_json.get("added_tokens", [])}
        with self._lock:
            ctx = self._host.context()
            self._fn = {name: ctx.eval(f"lanternXgrammar.{name}") for name in CALLS}
            self._wait(self._fn["init"](json.dumps(vocab), token_postproc, vocab_size, json.dumps(list(stop_ids))))

    @staticmethod
    def _wait(value: Any) -> Any:
        return value.get(timeout=600) if hasattr(value, "get") else value

    def _call(self, name: str, *args: Any) -> Any:
        with self._lock:
            if self._released:
                handles = [self._released.popleft() for _ in range(len(self._released))]
                self._fn["release"](json.dumps(handles))
            return self._wait(self._fn[name](*args))

    def release_later(self, handle: int) -> None:
        """Dispose of ``handle`` on the next call (safe from a finalizer: it takes no lock)."""
        self._released.append(handle)

    def compile(self, spec_kind: str, spec_source: str) -> WasmGrammar:
        """The compiled grammar, or HostRefusal with xgrammar's (or the spec's) reason."""
        out = json.loads(self._call("compile", json.dumps({"kind": spec_kind, "source": spec_source})))
        if "error" in out:
            raise HostRefusal(out["name"], out["error"])
        return WasmGrammar(self, out["value"])

    def matcher(self, grammar: WasmGrammar, vocab_size: int) -> WasmTokenMask:
        return WasmTokenMask(self, self._call("matcher", grammar.handle), vocab_size)


class WasmTokenMask:
    """The grammar state of one generation in the wasm build: grammars.TokenMask's interface."""

    def __init__(self, owner: WasmXgrammar, handle: int, vocab_size: int):
        self._owner = owner
        self._handle = handle
        self.vocab_size = vocab_size
        weakref.finalize(self, owner.release_later, handle)

    def allowed(self) -> np.ndarray:
        """A boolean array over the vocabulary: True where the grammar allows the token."""
        return allowed_tokens(np.frombuffer(bytes(self._owner._call("mask", self._handle)), dtype=np.uint32), self.vocab_size)

    def forced_text(self) -> str:
        """The text the grammar allows next and nothing else (a key, its punctuation), maybe empty."""
        return self._owner._call("forced", self._handle)

    def rollback(self, tokens: int) -> None:
        """Undo the last ``tokens`` accepted tokens."""
        self._owner._call("rollback", self._handle, tokens)

    def accept(self, token: int) -> None:
        if not self._owner._call("accept", self._handle, token):
            raise LanternError(f"internal: the grammar rejected token {token} it allowed")
