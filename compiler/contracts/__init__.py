"""The JSON files both runtimes read, in one place that belongs to neither twin.

- ``request_rules.json``: the OpenAI request rules (ranges, defaults, messages) that
  ``lantern.request_rules`` and webruntime/src/request_rules.ts apply alike;
- ``schema_support.json``: the JSON-schema keywords and formats the structured-output compiler
  (webruntime/src/structured.ts) accepts, refuses or ignores, and its compile limits;
- ``unicode_categories.json``: the Unicode general categories of ``\\p{..}`` in patterns, where
  Python's unicodedata and JavaScript agree (written by ci/gen/unicode_table.py).

The browser bundle inlines them at build time (webruntime/defines.mjs); Python reads them with ``read``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

FOLDER = Path(__file__).parent


@functools.cache
def read(name: str) -> dict:
    """The parsed contents of ``name`` (e.g. "request_rules.json"), read once per process."""
    return json.loads((FOLDER / name).read_text())
