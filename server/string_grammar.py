"""Exact grammars for JSON strings with a `pattern` or length bounds, which xgrammar 0.1.27 gets wrong.

What xgrammar does with them (measured on 0.1.27): a pattern is matched against the JSON *text* of
the string, not its value, so `[^a]+` lets a raw `"` through (invalid JSON) and counts `\\u0041` as
six characters; a pattern with an anchor inside (`a^b`) silently becomes any string; a pattern
together with minLength/maxLength drops the lengths; a length-bounded string lets raw control
characters through (a raw tab: invalid JSON).

So a string subschema with any of these is written in the grammar as a placeholder,
``lantern:string:<hex of [pattern, minLength, maxLength]>``, and ``string_rules`` writes its rules:

1. The pattern is parsed as the part of ECMA-262 (ajv's dialect) that Python's `re` reads alike
   (jsonschema's): literals, escapes, classes, groups, alternation, greedy or lazy quantifiers, and
   `^`/`$`. Lookaround, backreferences, word boundaries and named groups are refused by name.
   Where the two differ, only what both accept is allowed: `\\d`, `\\w`, `\\s` mean their ASCII
   sets (Python's also match other Unicode digits, letters and spaces), and a negated class or
   shorthand leaves out every character either engine might count in it. `\\p{..}` and `\\P{..}` (which
   Python's re lacks) are read as ajv reads them, with the u flag: a general category by any of
   ECMA-262's names, or Any, ASCII, Assigned; a category holds the code points that Python's
   unicodedata and JavaScript both give it (unicode_categories.json, written by ci/unicode_table.py),
   and a code point they disagree on or that is unassigned counts as "maybe" in every category.
2. The whole value must match (xgrammar's reading too): `abc` means `^abc$`, which is stricter than
   JSON Schema's search and so never lets an invalid value through.
3. Thompson's construction gives an automaton over code points (the Basic Multilingual Plane, no
   surrogates); the subset construction, run together with a counter of characters written, gives a
   DFA whose accepting states match and have a length within the bounds; dead states are dropped and
   equal ones merged (number_grammar.minimal_dfa).
4. Each DFA edge is a set of characters, written as JSON writes them: printable ASCII raw, `"` and
   `\\` and the control characters escaped, everything else as a `\\uXXXX` escape (xgrammar 0.1.27
   does not match non-ASCII characters in grammar classes, so a model writes them escaped).

The twin is webruntime/src/strings.ts: the same placeholders, errors and rules, character for
character (tests/test_structured_exact.py runs both).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from .number_grammar import minimal_dfa, payload_placeholder, placeholder_payload

MAX_NFA_STATES = 4000  # a pattern larger than this (after {n,m} copies) is refused
MAX_MERGED = 500  # equal states are merged in string automata up to this size (see minimal_dfa)
MAX_DFA_STATES = 2000  # states of the string automaton before merging, lengths counted (xgrammar's compile
# of a 1000-state chain: ~1.2 s against a 151k vocabulary)
TOP = 0xFFFF
ALL = ((0, 0xD7FF), (0xE000, TOP))  # code points a string may hold (no lone surrogates)
ASCII = ((0, 0x7F),)
DIGITS = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE = ((0x09, 0x0D), (0x20, 0x20))
# Characters some engine counts in \s beyond SPACE (Python: \x1c-\x1f; both: non-ASCII spaces).
SPACE_MAYBE = ((0x09, 0x0D), (0x1C, 0x20), (0x80, TOP))
LINE_ENDS = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))  # what `.` leaves out in JavaScript
SHORT_ESCAPES = {0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r"}
CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D, "0": 0x00}
SYNTAX = "^$\\.*+?()[]{}|/"
RAW = ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E))  # printable ASCII a JSON string holds unescaped
# \p{..}: the general categories both engines agree on, written by ci/unicode_table.py (read by strings.ts too)
UNICODE = json.loads(Path(__file__).with_name("unicode_categories.json").read_text())


class PatternError(ValueError):
    """A pattern Lantern cannot enforce exactly, or one that no string (within the lengths) matches."""


# ---- sets of code points: sorted, disjoint, non-touching (lo, hi) pairs --------------------------


def norm(pairs) -> tuple:
    out: list[list[int]] = []
    for lo, hi in sorted(pairs):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def minus(a, b) -> tuple:
    out = []
    for lo, hi in a:
        for blo, bhi in b:
            if bhi < lo or blo > hi:
                continue
            if blo > lo:
                out.append((lo, blo - 1))
            lo = bhi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return norm(out)


def intersect(a, b) -> tuple:
    return minus(a, minus(a, b))


# ---- the pattern ------------------------------------------------------------------------------
# A node: ("set", chars) | ("cat", [nodes]) | ("alt", [nodes]) | ("rep", node, lo, hi or None)
# | ("bol",) | ("eol",)


def _is_digit(ch: str) -> bool:
    return len(ch) == 1 and "0" <= ch <= "9"


class _Parser:
    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0

    def fail(self, what: str):
        raise PatternError(f"{what} at position {self.i} of the pattern")

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def parse(self):
        node = self.alt()
        if self.i < len(self.p):
            self.fail("unmatched ')'")
        return node

    def alt(self):
        branches = [self.seq()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.seq())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def seq(self):
        items = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.quantified(self.atom()))
        return ("cat", items)

    def number(self) -> int | None:
        start = self.i
        while _is_digit(self.peek()):
            self.i += 1
        return int(self.p[start : self.i]) if self.i > start else None

    def quantified(self, node):
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.i += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        elif ch == "{":
            self.i += 1
            lo = self.number()
            hi = lo
            if lo is None:
                self.fail("a '{' that starts no {n,m} quantifier")
            if self.peek() == ",":
                self.i += 1
                hi = self.number()
            if self.peek() != "}":
                self.fail("an unclosed {n,m} quantifier")
            self.i += 1
            if hi is not None and hi < lo:
                self.fail(f"a quantifier {{{lo},{hi}}} whose minimum is above its maximum")
        else:
            return node
        if node[0] in ("bol", "eol"):
            self.fail("a quantifier on an anchor")
        if self.peek() == "?":  # lazy: the same strings
            self.i += 1
        if self.peek() in ("*", "+", "?", "{"):
            self.fail("a quantifier on a quantifier")
        return ("rep", node, lo, hi)

    def atom(self):
        ch = self.peek()
        self.i += 1
        if ch == "(":
            if self.peek() == "?":
                if self.p.startswith("?:", self.i):
                    self.i += 2
                else:
                    self.fail("lookaround and named groups are not supported")
            node = self.alt()
            if self.peek() != ")":
                self.fail("an unclosed '('")
            self.i += 1
            return node
        if ch == "[":
            return ("set", self.char_class())
        if ch == ".":
            return ("set", minus(ALL, LINE_ENDS))
        if ch == "^":
            return ("bol",)
        if ch == "$":
            return ("eol",)
        if ch == "\\":
            certain, _ = self.escape(in_class=False)
            return ("set", certain)
        if ch in ("*", "+", "?", "{"):
            self.i -= 1
            self.fail(f"a quantifier '{ch}' with nothing to repeat")
        if ch in ("}", "]"):
            self.i -= 1
            self.fail(f"a lone '{ch}'")
        return ("set", self.literal(ch))

    def literal(self, ch: str) -> tuple:
        code = ord(ch)
        if code > TOP or 0xD800 <= code <= 0xDFFF:
            self.i -= 1
            self.fail("a character above U+FFFF" if code > TOP else "a lone surrogate")
        return ((code, code),)

    def escape(self, in_class: bool) -> tuple[tuple, tuple]:
        """(certain, possible) after a backslash: what every engine, and what some engine, matches."""
        ch = self.peek()
        self.i += 1
        shorthand = {
            "d": (DIGITS, norm(DIGITS + ((0x80, TOP),))),
            "w": (WORD, norm(WORD + ((0x80, TOP),))),
            "s": (SPACE, SPACE_MAYBE),
        }
        if ch.lower() in shorthand:
            certain, possible = shorthand[ch.lower()]
            if ch.islower():
                return certain, possible
            return intersect(minus(ALL, possible), ASCII), minus(ALL, certain)
        if ch in ("p", "P"):
            certain, possible = self.unicode_property(ch)
            return (minus(ALL, possible), minus(ALL, certain)) if ch == "P" else (certain, possible)
        if ch in CONTROL_ESCAPES:
            if ch == "0" and _is_digit(self.peek()):
                self.fail("an octal escape")
            code = CONTROL_ESCAPES[ch]
        elif ch in ("x", "u"):
            width = 2 if ch == "x" else 4
            digits = self.p[self.i : self.i + width]
            if len(digits) != width or not re.fullmatch(r"[0-9A-Fa-f]+", digits):
                self.fail(f"an escape \\{ch} without {width} hex digits")
            self.i += width
            code = int(digits, 16)
            if 0xD800 <= code <= 0xDFFF:
                self.fail("a surrogate escape")
        elif ch != "" and (ch in SYNTAX or (in_class and ch == "-")):
            code = ord(ch)
        else:
            self.i -= 1
            self.fail(f"the escape \\{ch} (not read alike by JavaScript and Python)" if ch else "a trailing backslash")
        return ((code, code),), ((code, code),)

    def unicode_property(self, ch: str) -> tuple[tuple, tuple]:
        """(certain, possible) of ``\\p{name}``: a general category (ECMA-262's names, as ajv reads a pattern
        with the u flag; Python's re has no \\p), Any, ASCII or Assigned. A code point the table leaves
        in no category (unassigned, or read differently by Python and JavaScript) is possible in each."""
        end = self.p.find("}", self.i)
        if self.peek() != "{" or end < 0:
            self.fail(f"a \\{ch} without a {{name}}")
        name = self.p[self.i + 1 : end]
        key, _, value = name.rpartition("=")
        if key not in ("", "gc", "General_Category"):
            self.fail(f"the Unicode property \\{ch}{{{name}}} (Lantern reads general categories, Any, ASCII and Assigned)")
        if not (value in UNICODE["names"] or (not key and value in BINARY_PROPERTIES)):
            self.fail(f"an unknown Unicode property \\{ch}{{{name}}}")
        self.i = end + 1
        if value in BINARY_PROPERTIES:
            return BINARY_PROPERTIES[value]
        certain = norm(r for c in UNICODE["names"][value] for r in CATEGORIES.get(c, ()))
        return certain, norm(certain + UNKNOWN)

    def class_atom(self) -> tuple[tuple, tuple, bool]:
        """(certain, possible, single character?) of one class member."""
        ch = self.peek()
        if ch == "":
            self.fail("an unclosed '['")
        self.i += 1
        if ch == "\\":
            certain, possible = self.escape(in_class=True)
            return certain, possible, len(certain) == 1 and certain[0][0] == certain[0][1] and certain == possible
        if ch == "[":
            self.i -= 1
            self.fail("a '[' inside a class (read differently by JavaScript and Python)")
        single = self.literal(ch)
        return single, single, True

    def char_class(self) -> tuple:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        certain: list = []
        possible: list = []
        if self.peek() == "]":
            self.fail("an empty class '[]'")
        while self.peek() != "]":
            c1, p1, single = self.class_atom()
            if self.peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                c2, p2, single2 = self.class_atom()
                if not (single and single2):
                    self.fail("a range with a class shorthand at one end")
                if c2[0][0] < c1[0][0]:
                    self.fail("a range out of order")
                c1 = p1 = ((c1[0][0], c2[0][0]),)
            certain += c1
            possible += p1
        self.i += 1
        if negated:
            return minus(ALL, norm(possible))
        return intersect(norm(certain), ALL)


def _table_ranges(text: str) -> tuple:
    return tuple((int(a, 16), int(b or a, 16)) for a, _, b in (r.partition("-") for r in text.split()))


CATEGORIES = {c: _table_ranges(text) for c, text in UNICODE["categories"].items()}
ASSIGNED = norm(r for ranges in CATEGORIES.values() for r in ranges)  # those both engines agree on
UNKNOWN = minus(ALL, ASSIGNED)
BINARY_PROPERTIES = {"Any": (ALL, ALL), "ASCII": (ASCII, ASCII), "Assigned": (ASSIGNED, ALL)}


def parse_pattern(pattern: str):
    return _Parser(pattern).parse()


def with_classes(pattern: str) -> str:
    """``pattern`` with each ``\\p{..}`` and ``\\P{..}`` written out as the class of the code points every
    engine counts in it, so that Python's re (which has no \\p) and JavaScript read it from the same
    table; a property Lantern does not read is left as it is."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and pattern[i + 1 : i + 2] in ("p", "P"):
            parser = _Parser(pattern)
            parser.i = i + 1
            try:
                chars = parser.escape(in_class)[0]
            except PatternError:
                out.append(pattern[i : i + 2])
                i += 2
                continue
            ranges = "".join(f"\\u{lo:04x}" if lo == hi else f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in chars)
            out.append(ranges if in_class else f"[{ranges}]" if ranges else "(?!)")
            i = parser.i
            continue
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        in_class = (in_class and ch != "]") or (not in_class and ch == "[")
        out.append(ch)
        i += 1
    return "".join(out)


def check_plain_pattern(pattern: str) -> None:
    """PatternError unless ``pattern`` matches some string and only ever characters of RAW, which
    xgrammar's own regex (matched against the JSON text, as for patternProperties keys) gets right."""

    def sets(node):
        if node[0] == "set":
            yield node[1]
        elif node[0] in ("cat", "alt"):
            for child in node[1]:
                yield from sets(child)
        elif node[0] == "rep":
            yield from sets(node[1])

    if any(minus(chars, RAW) for chars in sets(parse_pattern(pattern))):
        raise PatternError(
            "it may match a quote, a backslash, a control or a non-ASCII character, which the grammar engine "
            "would write unescaped here; narrow it to printable ASCII, or use propertyNames with the "
            "pattern (enforced exactly)"
        )
    string_dfa(pattern, 0, None)


# ---- pattern -> NFA -----------------------------------------------------------------------------


class _Nfa:
    """Edges per state: (kind, chars, target), kind "eps", "bol", "eol" or "set"."""

    def __init__(self):
        self.edges: list[list[tuple]] = []

    def state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise PatternError(f"the pattern needs more than {MAX_NFA_STATES} automaton states (shorten its {{n,m}} counts)")
        self.edges.append([])
        return len(self.edges) - 1

    def build(self, node, start: int) -> int:
        """Add ``node`` from ``start``; returns its end state."""
        kind = node[0]
        if kind == "set":
            end = self.state()
            self.edges[start].append(("set", node[1], end))
            return end
        if kind in ("bol", "eol"):
            end = self.state()
            self.edges[start].append((kind, (), end))
            return end
        if kind == "cat":
            for item in node[1]:
                start = self.build(item, start)
            return start
        if kind == "alt":
            end = self.state()
            for branch in node[1]:
                self.edges[self.build(branch, start)].append(("eps", (), end))
            return end
        _, inner, lo, hi = node
        for _ in range(lo):
            start = self.build(inner, start)
        if hi is None:  # a loop: start -> inner -> start
            loop = self.state()
            self.edges[start].append(("eps", (), loop))
            self.edges[self.build(inner, loop)].append(("eps", (), loop))
            return loop
        end = self.state()
        for _ in range(hi - lo):
            self.edges[start].append(("eps", (), end))
            start = self.build(inner, start)
        self.edges[start].append(("eps", (), end))
        return end


def _closure(nfa: _Nfa, threads, at_start: bool) -> frozenset:
    """Threads (state, past $) reachable without a character; `^` only before the first character."""
    seen, todo = set(threads), list(threads)
    while todo:
        state, ended = todo.pop()
        for kind, _, target in nfa.edges[state]:
            if kind == "eps" or (kind == "bol" and at_start) or kind == "eol":
                nxt = (target, ended or kind == "eol")
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    return frozenset(seen)


def _minterms(sets) -> list[tuple]:
    """The coarsest partition of the characters in any of ``sets`` into sets none of them splits."""
    cuts = sorted({lo for s in sets for lo, _ in s} | {hi + 1 for s in sets for _, hi in s})
    groups: dict[tuple, list] = {}
    for lo, nxt in zip(cuts, cuts[1:]):
        member = tuple(i for i, s in enumerate(sets) if any(a <= lo <= b for a, b in s))
        if member:
            groups.setdefault(member, []).append((lo, nxt - 1))
    return [norm(v) for v in groups.values()]


def string_dfa(pattern: str | None, min_length: int, max_length: int | None, search: bool = False):
    """(transitions over character sets, accepting, sets) of the minimal DFA; PatternError when empty.
    With ``search``, of the strings the pattern matches somewhere in (JSON Schema's reading), not in full."""
    nfa = _Nfa()
    start = nfa.state()
    anything = ("rep", ("set", ALL), 0, None)
    node = parse_pattern(pattern) if pattern is not None else anything
    end = nfa.build(("cat", [anything, node, anything]) if search else node, start)
    sets = _minterms([chars for edges in nfa.edges for kind, chars, _ in edges if kind == "set"])
    member: dict[tuple[int, int], list[int]] = {}  # (nfa state, minterm) -> targets
    for s, edges in enumerate(nfa.edges):
        for kind, chars, target in edges:
            if kind == "set":
                for m, term in enumerate(sets):
                    if intersect(term, chars) == term:
                        member.setdefault((s, m), []).append(target)
    cap = max_length if max_length is not None else min_length
    first = (_closure(nfa, {(start, False)}, True), 0)
    seen = {first}

    def step(state, m):
        threads, count = state
        if max_length is not None and count >= max_length:
            return None
        moved = {(t, False) for s, ended in threads if not ended for t in member.get((s, m), ())}
        if not moved:
            return None
        nxt = (_closure(nfa, moved, False), min(count + 1, cap))
        seen.add(nxt)
        if len(seen) > MAX_DFA_STATES:
            raise PatternError(f"the pattern with these lengths needs more than {MAX_DFA_STATES} automaton states")
        return nxt

    def accepts(state):
        threads, count = state
        return count >= min_length and any(s == end for s, _ in threads)

    dfa = minimal_dfa(first, step, accepts, range(len(sets)), MAX_MERGED)
    if dfa is None:
        raise PatternError("no string matches it" if pattern is not None else "no string has such a length")
    trans, accepting = dfa
    return trans, accepting, sets


def patterns_overlap(full: str, search: str) -> bool:
    """Whether some name matches ``full`` in full (as xgrammar generates a patternProperties name) and
    ``search`` somewhere (as a validator applies patternProperties); True where it cannot tell (an
    automaton too large, a pattern Lantern does not read)."""
    try:
        (ta, fa, sa), (tb, fb, sb) = string_dfa(full, 0, None), string_dfa(search, 0, None, search=True)
    except PatternError:
        return True
    seen, todo = {(0, 0)}, [(0, 0)]
    while todo:
        a, b = todo.pop()
        if fa[a] and fb[b]:
            return True
        for ma, na in ta[a].items():
            for mb, nb in tb[b].items():
                if (na, nb) not in seen and intersect(sa[ma], sb[mb]):
                    seen.add((na, nb))
                    todo.append((na, nb))
    return False


# ---- writing character sets as JSON text --------------------------------------------------------


def _hex_digits(lo: int, hi: int) -> str:
    """An EBNF class (or literal) for the hex digits lo..hi (lower case)."""
    if lo == hi:
        return f'"{lo:x}"'
    parts = []
    for a, b in ((lo, min(hi, 9)), (max(lo, 10), hi)):
        if a <= b:
            parts.append(f"{a:x}" if a == b else f"{a:x}-{b:x}")
    return f"[{''.join(parts)}]"


def _hex_ranges(lo: int, hi: int, width: int) -> list[list[tuple[int, int]]]:
    """The numbers lo..hi of ``width`` hex digits as sequences of per-digit ranges."""
    if width == 0:
        return [[]]
    base = 16 ** (width - 1)
    first, last = lo // base, hi // base
    if first == last:
        return [[(first, first), *rest] for rest in _hex_ranges(lo % base, hi % base, width - 1)]
    out = []
    if lo % base:
        out += [[(first, first), *rest] for rest in _hex_ranges(lo % base, base - 1, width - 1)]
        first += 1
    tail = []
    if hi % base != base - 1:
        tail = [[(last, last), *rest] for rest in _hex_ranges(0, hi % base, width - 1)]
        last -= 1
    if first <= last:
        out.append([(first, last)] + [(0, 15)] * (width - 1))
    return out + tail


def _class_char(code: int) -> str:
    """A printable ASCII character inside an EBNF class (xgrammar reads a \\x escape greedily: \\x60b is one)."""
    ch = chr(code)
    return "\\" + ch if ch in "]\\^-" else ch


def chars_ebnf(chars) -> str:
    """An EBNF expression for the JSON text of one character from ``chars``."""
    alts = []
    raw = intersect(chars, RAW)
    if raw:
        alts.append(
            "[" + "".join(_class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}" for lo, hi in raw) + "]"
        )
    if intersect(chars, ((0x22, 0x22),)):
        alts.append('"\\\\\\""')
    if intersect(chars, ((0x5C, 0x5C),)):
        alts.append('"\\\\\\\\"')
    escaped = []
    for lo, hi in minus(chars, RAW + ((0x22, 0x22), (0x5C, 0x5C))):
        for code in range(lo, min(hi, 0x1F) + 1):
            if code in SHORT_ESCAPES:
                alts.append(f'"\\\\{SHORT_ESCAPES[code]}"')
            else:
                escaped.append((code, code))
        if hi > 0x1F:
            escaped.append((max(lo, 0x7F), hi))
    if escaped:
        seqs = [seq for lo, hi in norm(escaped) for seq in _hex_ranges(lo, hi, 4)]
        body = " | ".join(" ".join(_hex_digits(a, b) for a, b in seq) for seq in seqs)
        alts.append(f'"\\\\u" ({body})' if len(seqs) > 1 else f'"\\\\u" {body}')
    return " | ".join(f"({a})" if " " in a and len(alts) > 1 else a for a in alts)


def one_class(pattern: str | None, min_length: int, max_length: int | None):
    """(characters, least, most) when the strings are a run of one class within lengths, written as
    xgrammar's repetition of one character class: a string with only a maxLength (characters: None, any
    character JSON holds raw, escapes left out), or a pattern like `^[a-z0-9]{2,40}$` over printable
    ASCII. Else None: the automaton, which counts escapes and non-ASCII characters exactly. (xgrammar
    masks a repeated single class in ~1 ms a token against a 49k vocabulary; a repeated alternation,
    or the automaton's chain, takes 20-120 ms.) PatternError when no length is left."""
    if pattern is None:
        return (None, 0, max_length) if min_length == 0 and max_length is not None else None
    node = parse_pattern(pattern)
    if node[0] == "cat":
        parts = node[1][1:] if node[1][:1] == [("bol",)] else node[1]
        parts = parts[:-1] if parts[-1:] == [("eol",)] else parts
        if len(parts) != 1:
            return None
        node = parts[0]
    if node[0] == "set":
        node = ("rep", node, 1, 1)
    if node[0] != "rep" or node[1][0] != "set" or not node[1][1] or minus(node[1][1], RAW):
        return None  # (an empty class: the automaton finds whether any string matches)
    lo = max(node[2], min_length)
    hi = node[3] if max_length is None else max_length if node[3] is None else min(node[3], max_length)
    if hi is not None and lo > hi:
        raise PatternError("no string matches it")
    return norm(node[1][1]), lo, hi


def string_rules(key: str, name: str) -> list[str]:
    """The EBNF rules (start: ``{name}_0``) for the placeholder ``key``: the quoted string."""
    run = one_class(*placeholder_payload(key))
    if run is not None:
        chars, lo, hi = run
        count = f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}"
        char = '[^"\\\\\\x00-\\x1f]' if chars is None else chars_ebnf(chars)  # one class, repeated in place:
        return [f'{name}_0 ::= "\\"" {char}{count} "\\""']  # through a rule, xgrammar masks it 50x slower
    trans, accepting, sets = _dfa(key)
    rules = [f'{name}_0 ::= "\\"" {name}_s0']
    char_rules: dict[tuple, str] = {}
    body = []
    for i, out in enumerate(trans):
        alts = ['"\\""'] if accepting[i] else []
        by_target: dict[int, list] = {}
        for m, t in out.items():
            by_target.setdefault(t, []).extend(sets[m])
        for t, chars in by_target.items():
            chars = norm(chars)
            if chars not in char_rules:
                char_rules[chars] = f"{name}_c{len(char_rules)}"
            alts.append(f"{char_rules[chars]} {name}_s{t}")
        body.append(f"{name}_s{i} ::= {' | '.join(alts)}")
    rules += body
    rules += [f"{rule} ::= {chars_ebnf(chars)}" for chars, rule in char_rules.items()]
    return rules


# ---- placeholders -------------------------------------------------------------------------------

KIND = "string"


def placeholder(pattern: str | None, min_length: int, max_length: int | None) -> str:
    """The placeholder for a string subschema: its pattern and lengths, hex-encoded (xgrammar prints
    the placeholder as a JSON string, so it must hold nothing it would escape). The pattern is parsed
    first, so a lone surrogate (which UTF-8 cannot hold) is a PatternError."""
    if pattern is not None:
        parse_pattern(pattern)
    return payload_placeholder(KIND, [pattern, min_length, max_length])


@functools.lru_cache(maxsize=256)  # a request's schema is checked, then compiled: one automaton for both
def _dfa(key: str):
    return string_dfa(*placeholder_payload(key))
