"""The structured-output compiler's one copy, run in V8: what `lantern serve` asks of it.

The schema rules and the grammar writers (the normalizer, the checks, numbers, strings and patterns,
unique items, the request-to-spec step) are written once, in TypeScript (webruntime/src/structured.ts and
the files it imports), and the browser bundles them. `npm run build` also bundles them as one plain
script, webruntime/dist/schema-host.js (a wheel carries it in lantern/webruntime/), which this module
evaluates in an embedded V8 (mini-racer) on first use: 0.07 s on an idle machine (0.14 s on a busy one), once per process.

Each call sends JSON in and gets JSON back (webruntime/src/schema-host.ts says the protocol), a few
hundred microseconds beside the milliseconds a schema takes. A refusal comes back as
:class:`HostRefusal` with the TypeScript error's class and message; structured.py turns the request
errors into HTTP 400s. One V8 context serves every thread, one call at a time.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from ..errors import LanternError
from .static import CHECKOUT, RUNTIME

BUNDLE = RUNTIME / "schema-host.js"

# mini-racer's default (one thread) plus V8's optimizing wasm compiler from the start: xgrammar's wasm
# build (xgrammar_wasm.py) compiles a large grammar in about half the time it takes on the baseline
# compiler (Liftoff) that V8 otherwise starts with. The flags are process-wide, set before the first
# context; they change nothing for plain JavaScript.
V8_FLAGS = ("--single-threaded", "--no-liftoff")


class HostRefusal(LanternError):
    """The compiler refused its input: ``kind`` is the TypeScript error's class (InvalidRequestError for a
    schema or request Lantern does not accept; PatternError, NumberRangeError, UniqueItemsError from a
    grammar writer, which only tests call directly)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class SchemaHost:
    """One V8 context with the compiler's script, made on the first call."""

    def __init__(self, bundle: Path = BUNDLE) -> None:
        self.bundle = bundle
        self._lock = threading.Lock()
        self._ctx: Any = None

    def context(self):
        """The V8 context, made (and the bundle evaluated) on first use."""
        if self._ctx is None:
            if not self.bundle.exists():
                where = f"run `npm ci && npm run build` in {RUNTIME.parent}" if CHECKOUT else "its wheel was built without it"
                raise LanternError(f"the structured-output compiler ({self.bundle.name}) is missing: {where}")
            from py_mini_racer import MiniRacer, init_mini_racer

            init_mini_racer(flags=V8_FLAGS, ignore_duplicate_init=True)
            ctx = MiniRacer()
            ctx.eval(self.bundle.read_text())
            self._ctx = ctx
        return self._ctx

    def call(self, name: str, *args: Any) -> Any:
        """``name``'s value for ``args`` (JSON values), or HostRefusal."""
        with self._lock:
            out = json.loads(self.context().call("lanternSchemaHost", name, json.dumps(args)))
        if "error" in out:
            raise HostRefusal(out["name"], out["error"])
        return out["value"]


HOST = SchemaHost()
