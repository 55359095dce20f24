"""Exact grammars for `uniqueItems` arrays of listed values, which xgrammar 0.1.27 ignores.

An array whose items are an `enum`, a `const` or booleans, with `uniqueItems: true`, is written in
the grammar as a placeholder, ``lantern:unique:<hex of [[value texts], minItems, maxItems]>``, and
``unique_rules`` writes one rule per set of values already used: each next value is one not used
yet, and the array may close once it holds minItems. The values are written as JSON in ASCII
(strings with \\uXXXX escapes, numbers with no exponent), so equal values have one text.

The twin is webruntime/src/unique.ts (tests/test_structured_exact.py runs both).
"""

from __future__ import annotations

import json

from .number_grammar import decimal_of, payload_placeholder, placeholder_payload

MAX_RULES = 2000  # sets of used values the rules may need
KIND = "unique"


class UniqueItemsError(ValueError):
    """uniqueItems on items Lantern cannot enumerate, or an array no unique values can fill."""


def value_text(value) -> str:
    """The one JSON text a listed value is written as."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return decimal_of(value).text()
    if isinstance(value, str):
        return json.dumps(value)  # ASCII: non-ASCII characters as \uXXXX
    raise UniqueItemsError("uniqueItems needs items whose values are strings, numbers, booleans or null")


def _of_type(value, types) -> bool:
    if types is None:
        return True
    kinds = {
        "null": value is None,
        "boolean": isinstance(value, bool),
        "string": isinstance(value, str),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "integer": isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer(),
    }
    return any(kinds.get(t, False) for t in ([types] if isinstance(types, str) else types))


def item_values(items) -> list[str]:
    """The distinct value texts an `items` schema allows (an enum or const filtered by its type, or
    the booleans), or UniqueItemsError."""
    if isinstance(items, dict) and set(items) <= {"enum", "const", "type", "title", "description"}:
        if "const" in items:
            values = [items["const"]]
        elif "enum" in items:
            values = items["enum"] if isinstance(items["enum"], list) else []
        elif items.get("type") == "boolean":
            values = [True, False]
        else:
            values = None
        if values is not None:
            return list(dict.fromkeys(value_text(v) for v in values if _of_type(v, items.get("type"))))
    raise UniqueItemsError("uniqueItems is supported for arrays whose items are an enum, a const or booleans")


def placeholder(values: list[str], min_items: int, max_items: int | None) -> str:
    return payload_placeholder(KIND, [values, min_items, max_items])


def _ebnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unique_rules(key: str, name: str) -> list[str]:
    """The EBNF rules (start: ``{name}_0``) for the placeholder ``key``: the whole array."""
    values, lo, hi = placeholder_payload(key)
    hi = len(values) if hi is None else min(hi, len(values))
    if lo > hi:
        raise UniqueItemsError(
            f"minItems {lo} needs more distinct values than the {len(values)} its items allow"
            if lo > len(values)
            else f"minItems {lo} is above maxItems {hi}"
        )
    literals = [_ebnf_literal(v) for v in values]
    rules, index, order = [], {0: 0}, [0]
    for used in order:  # breadth-first over the sets of used values, as bit masks
        count = bin(used).count("1")
        alts = ['"]"'] if count >= lo else []
        if count < hi:
            for j, literal in enumerate(literals):
                if not used >> j & 1:
                    nxt = used | 1 << j
                    if nxt not in index:
                        if len(order) >= MAX_RULES:
                            raise UniqueItemsError(
                                f"the array's unique values need more than {MAX_RULES} grammar "
                                "rules (list fewer values or lower maxItems)"
                            )
                        index[nxt] = len(order)
                        order.append(nxt)
                    separator = "" if used == 0 else '", " '
                    alts.append(f"{separator}{literal} {name}_u{index[nxt]}")
        rules.append(f"{name}_u{index[used]} ::= {' | '.join(alts)}")
    return [f'{name}_0 ::= "[" {name}_u0', *rules]
