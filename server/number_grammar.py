"""Exact grammars for JSON numbers between bounds, which xgrammar 0.1.27 does not enforce exactly.

A schema's `number` or `integer` with bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum)
or a multipleOf is written in the grammar as a placeholder string, ``lantern:number:ge=-1.5:lt=100:mul=0.5``
(structured.check_schema does that). After xgrammar turns the schema into EBNF,
``structured.with_exact_rules`` swaps each placeholder for rules that admit exactly the JSON numbers
within the bounds (and multiples, see multiple_of), written with no exponent and at most MAX_DIGITS digits.

Why 15 digits: validators (jsonschema, ajv) read a number and its bounds as IEEE-754 doubles. Two
different decimals of at most 15 significant digits are never the same double (15 is DBL_DIG: such
a decimal survives a round trip through a double), and rounding to the nearest double keeps order.
So for a bound whose shortest decimal form has at most 15 digits, comparing the decimal texts gives
the validator's answer, exclusive bounds included. A bound with 16 or 17 digits (0.1 + 0.2, say)
is first rounded inwards to 15 digits, which can only leave out values, never let one in.

The rules come from a small deterministic automaton over the characters ``-``, ``.``, ``0-9``: the
integer part is compared with each bound's digit by digit (a longer integer part is larger), then
the fraction; for a multipleOf it also keeps the remainder of the digits read so far. States that
cannot reach an end within the bounds are dropped, so the model can never
write itself into a dead end, and equivalent states are merged (Moore's partition refinement).

The twin is webruntime/src/numbers.ts: the same placeholders and the same rules, character for
character (tests/test_structured_exact.py runs both).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import cast

MAX_DIGITS = 15
MAX_MULTIPLE = 250  # multipleOf as an integer of its digits (0.25 -> 25): the automaton keeps a remainder (250: ~0.4 s)
PREFIX = "lantern:"
# A placeholder as xgrammar prints it inside a rule: the JSON string literal, quotes escaped.
SYMBOLS = "-.0123456789"


@dataclass(frozen=True)
class Decimal:
    """A finite decimal: sign, integer digits (no leading zeros, "" below 1), fraction (no trailing zeros)."""

    negative: bool
    whole: str
    fraction: str

    def text(self) -> str:
        body = (self.whole or "0") + (f".{self.fraction}" if self.fraction else "")
        return f"-{body}" if self.negative else body

    def digits(self) -> int:
        """Significant digits."""
        return len((self.whole + self.fraction).strip("0"))


def decimal_of(value: float) -> Decimal:
    """The shortest decimal that reads back as ``value`` (what repr and JavaScript's String print)."""
    return decimal_from_text(repr(float(value)))


def decimal_from_text(text: str) -> Decimal:
    """A Decimal from a number's text, with or without an exponent (1e-07, 1.5e+21, -0.25)."""
    mantissa, _, exponent = text.lower().partition("e")
    negative = mantissa.startswith("-")
    whole, _, fraction = mantissa.lstrip("+-").partition(".")
    digits, point = whole + fraction, len(whole) + int(exponent or 0)
    if point <= 0:
        whole, fraction = "", "0" * -point + digits
    elif point >= len(digits):
        whole, fraction = digits + "0" * (point - len(digits)), ""
    else:
        whole, fraction = digits[:point], digits[point:]
    whole, fraction = whole.lstrip("0"), fraction.rstrip("0")
    return Decimal(negative and bool(whole or fraction), whole, fraction)


def round_inwards(d: Decimal, up: bool) -> Decimal:
    """``d`` cut to MAX_DIGITS significant digits, towards +infinity if ``up`` else towards -infinity."""
    if d.digits() <= MAX_DIGITS:
        return d
    digits = d.whole + d.fraction
    first = len(digits) - len(digits.lstrip("0"))
    keep = first + MAX_DIGITS  # digits kept, counted from the left of `digits`
    kept, dropped = digits[:keep], digits[keep:]
    away = up != d.negative and dropped.strip("0") != ""  # magnitude rounds up
    if away:
        kept = str(int(kept) + 1).rjust(len(kept), "0")
    grown = len(kept) - keep  # a carry may add a digit on the left
    point = len(d.whole) + grown
    kept = kept + "0" * max(0, point - len(kept))
    return Decimal(d.negative, kept[:point].lstrip("0"), kept[point:].rstrip("0"))


@dataclass(frozen=True)
class Bound:
    """One side of a range on a non-negative magnitude: its decimal, and whether it is allowed."""

    value: Decimal
    inclusive: bool


def placeholder(kind: str, schema: dict) -> str:
    """The placeholder string for a bounded ``kind`` ("number"/"integer") subschema; every bound kept."""
    parts = [PREFIX + kind]
    for key, op in (
        ("minimum", "ge"),
        ("exclusiveMinimum", "gt"),
        ("maximum", "le"),
        ("exclusiveMaximum", "lt"),
        ("multipleOf", "mul"),
    ):
        if key in schema:
            parts.append(f"{op}={decimal_of(schema[key]).text()}")
    return ":".join(parts)


def payload_placeholder(kind: str, payload) -> str:
    """A placeholder carrying ``payload`` (JSON) hex-encoded: xgrammar prints a placeholder as a JSON
    string, so it must hold nothing xgrammar would escape (string_grammar's and unique_grammar's)."""
    return f"{PREFIX}{kind}:{json.dumps(payload, ensure_ascii=False, separators=(',', ':')).encode().hex()}"


def placeholder_payload(key: str):
    """The payload of a payload_placeholder."""
    return json.loads(bytes.fromhex(key.split(":", 2)[2]).decode())


def multiple_of(text: str) -> tuple[int, int]:
    """(m, e) for a multipleOf written ``text``: x is a multiple when x * 10**e is an integer that m divides.

    Validators divide doubles: jsonschema and ajv find 0.07 no multiple of 0.01 (0.07 / 0.01 is
    7.000000000000001). For a multipleOf that is a binary fraction (an integer, 0.5, 0.25, 2.5, ...)
    every multiple of at most MAX_DIGITS digits, divided by it, gives its whole quotient exactly, so
    the validators agree with decimal arithmetic; any other multipleOf is refused."""
    d = decimal_from_text(text)
    if d.negative or not (d.whole or d.fraction):
        raise NumberRangeError("must be a number above 0")
    m, e = int(d.whole + d.fraction), len(d.fraction)
    if m % 5**e:
        raise NumberRangeError(
            f"{text} is not a binary fraction, and validators dividing doubles reject exact "
            f"multiples of it (0.07 / 0.01 = {0.07 / 0.01!r}); use an integer or a power-of-two "
            "fraction such as 0.5 or 0.25, or scale the value (cents as an integer)"
        )
    return m, e


def _tighter(a: tuple[float, bool] | None, b: tuple[float, bool] | None, lower: bool) -> tuple[float, bool] | None:
    if a is None or b is None:
        return a or b
    if a[0] != b[0]:
        return a if (a[0] > b[0]) == lower else b
    return a if not a[1] else b  # the same value: exclusive wins


def parse_placeholder(key: str):
    """(kind, lower, upper, multiple) of a placeholder; a bound is (decimal, inclusive), cut to MAX_DIGITS
    inwards; multiple is multiple_of's (m, e) or None."""
    kind, *ops = key[len(PREFIX) :].split(":")
    lower = upper = multiple = None
    for op in ops:
        name, value = op.split("=")
        if name == "mul":
            multiple = multiple_of(value)
            continue
        bound = (float(value), name in ("ge", "le"))
        if name in ("ge", "gt"):
            lower = _tighter(lower, bound, True)
        else:
            upper = _tighter(upper, bound, False)
    return kind, _inwards(lower, True), _inwards(upper, False), multiple


def _inwards(bound: tuple[float, bool] | None, up: bool) -> tuple[Decimal, bool] | None:
    """A bound as a decimal of at most MAX_DIGITS digits. Cut, it becomes inclusive: no written number
    lies between the cut and the bound, and the cut is not the bound's double (or the bound's shortest
    form would have had MAX_DIGITS digits), so it is inside even for an exclusive bound."""
    if bound is None:
        return None
    exact = decimal_of(bound[0])
    cut = round_inwards(exact, up)
    return (cut, bound[1] or cut != exact)


# ---- comparing a magnitude with a bound, one character at a time -------------------------------
# A comparator state: ("i", n, c) in the integer part, after n digits, c the comparison of those
# digits with the bound's first n; ("f", j) equal so far, j fraction digits in; "<" or ">" settled.


def _digit(state, d: str, bound: Decimal, in_fraction: bool):
    if isinstance(state, str):
        return state
    if in_fraction:
        j = state[1]
        if j < len(bound.fraction):
            return "<" if d < bound.fraction[j] else ">" if d > bound.fraction[j] else ("f", j + 1)
        return ">" if d != "0" else state
    _, n, c = state
    if n >= len(bound.whole):
        return ">"  # a longer integer part
    if c == "=":
        c = "<" if d < bound.whole[n] else ">" if d > bound.whole[n] else "="
    return ("i", n + 1, c)


def _point(state, bound: Decimal):
    if isinstance(state, str) or state[0] == "f":
        return state
    _, n, c = state
    if n < len(bound.whole):
        return "<"
    return c if c != "=" else ("f", 0)


def _end(state, bound: Decimal) -> str:
    state = _point(state, bound)
    if isinstance(state, str):
        return state
    return "<" if state[1] < len(bound.fraction) else "="


class _Magnitude:
    """Reading a magnitude (digits, maybe a fraction) between ``lower`` and ``upper`` (Bound or None),
    a multiple of ``multiple`` ((m, e) from multiple_of, or None): then the state also holds the
    digits read so far modulo m, and how many of them are fraction digits (at most e)."""

    def __init__(self, lower: Bound | None, upper: Bound | None, integer: bool, multiple: tuple[int, int] | None):
        self.lower, self.upper, self.integer, self.multiple = lower, upper, integer, multiple

    def start(self):
        return ("S", 0, self._settle(("i", 0, "="), ("i", 0, "=")), self.multiple and (0, 0))

    def _settle(self, lo, hi):
        """Drop a comparator once its bound can no longer fail; None for a state that cannot succeed."""
        if self.lower is None or lo == ">":
            lo = None
        elif lo == "<":
            return None
        if self.upper is None or hi == "<":
            hi = None
        elif hi == ">":
            return None
        return (lo, hi)

    def step(self, state, ch: str):
        phase, count, (lo, hi), rem = state
        # a comparator (lo, hi) is kept only beside its bound (_settle), so it is never read with None
        lb = cast(Decimal, self.lower.value if self.lower else None)
        ub = cast(Decimal, self.upper.value if self.upper else None)
        if ch == ".":
            if phase not in ("Z", "I") or self.integer:
                return None
            cmp = self._settle(lo and _point(lo, lb), hi and _point(hi, ub))
            return cmp and ("D", count, cmp, rem)
        if ch == "-" or phase == "Z" or count + (phase != "S" or ch != "0") > MAX_DIGITS:
            return None
        if phase == "S" and ch == "0":
            return ("Z", 0, (lo, hi), rem)
        frac = phase in ("D", "F")
        if rem:
            assert self.multiple is not None  # start() keeps a remainder only for a multiple
            m, e = self.multiple
            if frac and rem[1] == e:  # past e fraction digits only zeros keep a multiple
                if ch != "0":
                    return None
            else:
                rem = ((rem[0] * 10 + int(ch)) % m, rem[1] + frac)
        cmp = self._settle(lo and _digit(lo, ch, lb, frac), hi and _digit(hi, ch, ub, frac))
        return cmp and ("F" if frac else "I", count + 1, cmp, rem)

    def accepts(self, state) -> bool:
        phase, _, (lo, hi), rem = state
        if phase not in ("Z", "I", "F"):
            return False
        if rem:
            assert self.multiple is not None  # start() keeps a remainder only for a multiple
            if rem[0] * 10 ** (self.multiple[1] - rem[1]) % self.multiple[0]:
                return False
        if lo is not None:
            assert self.lower is not None  # _settle keeps lo only beside a lower bound
            r = _end(lo, self.lower.value)
            if not (r == ">" or (r == "=" and self.lower.inclusive)):
                return False
        if hi is not None:
            assert self.upper is not None  # _settle keeps hi only beside an upper bound
            r = _end(hi, self.upper.value)
            if not (r == "<" or (r == "=" and self.upper.inclusive)):
                return False
        return True


def _abs(d: Decimal) -> Decimal:
    return Decimal(False, d.whole, d.fraction)


def _is_zero(d: Decimal) -> bool:
    return not (d.whole or d.fraction)


def number_automaton(
    kind: str, lower: tuple[Decimal, bool] | None, upper: tuple[Decimal, bool] | None, multiple: tuple[int, int] | None = None
):
    """(start, step, accepts) of the DFA for numbers of ``kind`` within the bounds (and multiples of
    ``multiple``, multiple_of's (m, e), if given)."""
    integer = kind == "integer"
    parts = {}
    # non-negative values: [max(lower, 0), upper]
    if upper is None or not (upper[0].negative or (_is_zero(upper[0]) and not upper[1])):
        lo = None if lower is None or lower[0].negative else Bound(lower[0], lower[1])
        parts["+"] = _Magnitude(lo, upper and Bound(upper[0], upper[1]), integer, multiple)
    # negative values, as magnitudes y = -x > 0: y >= |upper| (if upper < 0), y <= |lower|
    if lower is None or lower[0].negative:
        lo = Bound(_abs(upper[0]), upper[1]) if upper is not None and upper[0].negative else Bound(Decimal(False, "", ""), False)
        hi = Bound(_abs(lower[0]), lower[1]) if lower is not None else None
        parts["-"] = _Magnitude(lo, hi, integer, multiple)

    start = ("top",)

    def step(state, ch):
        if state == start:
            if ch == "-":
                return ("-", parts["-"].start()) if "-" in parts else None
            if "+" not in parts:
                return None
            state = ("+", parts["+"].start())
        side, inner = state
        nxt = parts[side].step(inner, ch)
        return nxt and (side, nxt)

    def accepts(state):
        return state != start and parts[state[0]].accepts(state[1])

    return start, step, accepts


def minimal_dfa(start, step, accepts, symbols=SYMBOLS, merge_limit: int | None = None) -> tuple[list[dict], list[bool]] | None:
    """The minimal DFA (states numbered from 0 = start in breadth-first order, symbols in ``symbols``
    order) as (transitions, accepting); None if it accepts nothing. ``step`` returns None for no edge.
    With ``merge_limit``, an automaton of more live states is only trimmed, not merged."""
    order, index, edges = [start], {start: 0}, []
    for state in order:  # breadth-first: grows while we walk it
        out = {}
        for ch in symbols:
            nxt = step(state, ch)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = len(order)
                    order.append(nxt)
                out[ch] = index[nxt]
        edges.append(out)
    final = [accepts(s) for s in order]
    sources: list[list[int]] = [[] for _ in order]
    for i, out in enumerate(edges):
        for t in out.values():
            sources[t].append(i)
    live = {i for i, f in enumerate(final) if f}  # states that can still reach an end: back from the ends
    todo = list(live)
    while todo:
        for i in sources[todo.pop()]:
            if i not in live:
                live.add(i)
                todo.append(i)
    if 0 not in live:
        return None
    # Moore: split classes until every state in a class goes where its classmates go. It takes a round
    # per state on a long counting chain (a string's maxLength 1000: seconds), where states are distinct
    # anyway: past merge_limit each stays its own class (the rules are longer, never wrong).
    merge = merge_limit is None or len(live) <= merge_limit
    cls = {i: int(final[i]) if merge else i for i in live}
    while merge:
        sig = {i: (cls[i], tuple((ch, cls[t]) for ch, t in edges[i].items() if t in live)) for i in live}
        names: dict = {}
        new = {i: names.setdefault(sig[i], len(names)) for i in sorted(live)}
        if len(names) == len(set(cls.values())):
            break
        cls = new
    # renumber classes breadth-first from the start
    number, queue = {cls[0]: 0}, [cls[0]]
    rep: dict[int, int] = {}
    for i in sorted(live):
        rep.setdefault(cls[i], i)
    trans, accepting = [], []
    for c in queue:
        i = rep[c]  # the start state for its own class: 0 is the smallest live state
        out = {}
        for ch, t in edges[i].items():
            if t in live:
                if cls[t] not in number:
                    number[cls[t]] = len(number)
                    queue.append(cls[t])
                out[ch] = number[cls[t]]
        trans.append(out)
        accepting.append(final[i])
    return trans, accepting


def _symbols_text(chars: list[str]) -> str:
    if len(chars) == 1:
        return f'"{chars[0]}"'
    out, k = [], 0
    while k < len(chars):
        j = k
        while j + 1 < len(chars) and ord(chars[j + 1]) == ord(chars[j]) + 1 and chars[j + 1].isdigit() and chars[k].isdigit():
            j += 1
        out.append(chars[k] if j == k else f"{chars[k]}-{chars[j]}" if j > k + 1 else chars[k] + chars[j])
        k = j + 1
    return f"[{''.join(out)}]"


def dfa_rules(name: str, trans: list[dict[str, int]], accepting: list[bool]) -> list[str]:
    """Right-linear EBNF: rule ``{name}_{i}`` for state i."""
    rules = []
    for i, out in enumerate(trans):
        alts = ['""'] if accepting[i] else []
        targets: dict[tuple[int, bool], list[str]] = {}  # "-" on its own: never inside a class
        for ch in SYMBOLS:
            if ch in out:
                targets.setdefault((out[ch], ch == "-"), []).append(ch)
        for (t, _), chars in targets.items():
            alts.append(f"{_symbols_text(chars)} {name}_{t}")
        rules.append(f"{name}_{i} ::= {' | '.join(alts)}")
    return rules


class NumberRangeError(ValueError):
    """No number the grammar can write lies between the bounds."""


def number_rules(key: str, name: str) -> list[str]:
    """The EBNF rules (start: ``{name}_0``) for the placeholder ``key``."""
    return dfa_rules(name, *_dfa(key))


@functools.lru_cache(maxsize=512)  # a request's schema is checked, then compiled: one automaton for both
def _dfa(key: str) -> tuple[list[dict[str, int]], list[bool]]:
    kind, lower, upper, multiple = parse_placeholder(key)
    if multiple and multiple[0] > MAX_MULTIPLE:
        raise NumberRangeError(
            f"a multipleOf whose digits read above {MAX_MULTIPLE} is not supported (its grammar keeps a rule per remainder)"
        )
    dfa = minimal_dfa(*number_automaton(kind, lower, upper, multiple))
    if dfa is None:
        between = "lies between the bounds" if lower or upper else "exists"
        raise NumberRangeError(f"no {kind} of at most {MAX_DIGITS} digits{' that is a multiple' if multiple else ''} {between}")
    return dfa
