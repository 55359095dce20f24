"""Closing a JSON answer that max_tokens cut: the model's text up to a point, then the grammar's end.

A JSON schema answer that runs out of tokens is not JSON, and a small model runs out often (an array
that goes on, a string of digits up to its bound). So when a request with a JSON schema reaches
max_tokens, the answer is rewound to the latest token from which the grammar can be finished within
the budget, and finished there by a fixed policy that reads only the grammar:

    end the answer where the grammar allows it; else the first allowed token in an order of preference
    that depends on where the text is (closing_order): tokens that close first (`"` in a string, `]`
    and `}` outside), then a one-token value where a value starts, then text, longest first (in a
    string that may not end yet, one of the first few after which it may, if there is one), and a
    number that goes on only when nothing else may come.

The answer then validates, is at most max_tokens long, and keeps finish_reason "length". The last
``HOLD`` tokens of such a request are held back from the stream until it is known whether they stay.

The browser's twin is webruntime/src/closing.ts (the same order and policy); test_closing.py holds
them equal.
"""

from __future__ import annotations

import numpy as np

HOLD = 64  # tokens at the end of a closable answer that may be rewound, and so are not streamed early
LOOKAHEAD = 8  # inside a string that may not end yet: candidates tried for one after which it may
WORK = 2000  # masks one close() may compute: an answer that cannot be closed gives up in bounded time
VALUES = ("0", '""', "[]", "{}", "null", "true", "false")
NUMBER = "0123456789.eE+-"
# Where a JSON text is: where a value (or key) may start (after `:`, `[`, `,`, `{` or nothing), elsewhere
# outside a string (after a value, inside a number or literal), inside a string, after a backslash in one.
VALUE, AFTER, INSIDE, ESCAPED = 0, 1, 2, 3


def lex(state: int, text: str) -> int:
    """Where a JSON text is after ``text``, from ``state``."""
    for c in text:
        if state == ESCAPED:
            state = INSIDE
        elif state == INSIDE:
            state = AFTER if c == '"' else ESCAPED if c == "\\" else INSIDE
        elif c == '"':
            state = INSIDE
        elif c in ":[,{":
            state = VALUE
        elif c not in " \t\n\r":
            state = AFTER
    return state


def _rank(text: str, where: int) -> tuple[int, int]:
    """A token's class and its place in the class (lower first) at ``where`` (VALUE, AFTER or INSIDE)."""
    if "\ufffd" in text:
        return 9, 0  # a piece of a character
    size = len(text.encode())
    blank = not text.strip(" \t\n\r")
    if where == INSIDE:
        if text[0] == '"' and all(c in '"]}' for c in text):
            return 0, -size  # ends the string, and maybe more
        return (3, size) if blank else (2, -size)
    if all(c in "]}" for c in text):
        return 0, -size
    if where == VALUE and text.removeprefix(" ") in VALUES:
        return 1, 0
    if blank:
        return 3, size
    if where == AFTER and text[0] in NUMBER:
        return 4, -size  # a number goes on
    return 2, -size


def closing_order(texts: list[str], left, where: int) -> list[int]:
    """The vocabulary's token ids (``texts``: each token decoded alone) in the policy's order of
    preference at ``where`` (VALUE, AFTER or INSIDE), ``left`` and tokens without text left out:
    - inside a string: tokens that end it (`"` then only `"]}`), longest first; text, longest first;
      whitespace, shortest first;
    - outside: tokens that only close (`]`, `}`), longest first; where a value starts, a one-token value
      (`0`, `""`, `[]`, `{}`, `null`, `true`, `false`, after a space or not); text, longest first;
      whitespace, shortest first; after a value, text that goes on with a number (a digit, `.`, `e`,
      `+`, `-`), longest first;
    - pieces of a character (U+FFFD when decoded alone) last.
    Lengths are in UTF-8 bytes; ties go to the lower id. The twin of closingOrder in
    webruntime/src/closing.ts."""
    skip = set(left)
    keys = sorted((*_rank(text, where), i) for i, text in enumerate(texts) if text and i not in skip)
    return [k[2] for k in keys]


class Closer:
    """The closing policy for one vocabulary (made once per model)."""

    def __init__(self, texts: list[str], left, stop_ids):
        """``texts``: each token decoded alone; ``left``: tokens the policy never writes (stop and added
        tokens)."""
        self.texts = texts
        self.orders = tuple(np.array(closing_order(texts, left, where), dtype=np.int64) for where in (VALUE, AFTER, INSIDE))
        inside = self.orders[INSIDE]
        self.enders = inside[: sum(_rank(texts[i], INSIDE)[0] == 0 for i in inside)]  # tokens that end a string
        self.stop_ids = np.array(sorted(stop_ids), dtype=np.int64)

    @classmethod
    def for_tokenizer(cls, tokenizer, tokenizer_json: dict, vocab_size: int, stop_ids) -> Closer:
        """The policy for a model: each token decoded alone by its tokenizer (``tokenizers``), its stop
        tokens and tokenizer.json's added tokens never written. The twin of Closer.forTokenizer."""
        size = min(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True))
        texts = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
        added = [t["id"] for t in tokenizer_json.get("added_tokens", [])]
        return cls(texts + [""] * (vocab_size - size), [*stop_ids, *added], stop_ids)

    def path(self, mask, limit: int, state: int = VALUE, work: list[int] | None = None) -> list[int] | None:
        """The policy's tokens from ``mask``'s state (and the text's ``state``, see ``lex``) to where the
        grammar may end, or None when that takes more than ``limit`` tokens, the grammar allows no
        token, or the masks left in ``work`` (one count, shared by a close(); WORK) are spent. ``mask``
        is left as it was."""
        work = [WORK] if work is None else work
        path: list[int] = []
        try:
            while True:
                if work[0] <= 0:
                    return None
                work[0] -= 1
                allowed = mask.allowed()
                if allowed[self.stop_ids[self.stop_ids < len(allowed)]].any():
                    return path
                if len(path) >= limit:
                    return None
                order = self.orders[min(state, INSIDE)]
                hits = order[np.flatnonzero(allowed[order])]
                if not len(hits):
                    return None
                token = int(hits[0])
                if state != AFTER and state != VALUE and not allowed[self.enders].any():
                    found = self._toward_end(mask, hits[:LOOKAHEAD], work)
                    token = token if found is None else found
                mask.accept(token)
                path.append(token)
                state = lex(state, self.texts[token])
        finally:
            if path:
                mask.rollback(len(path))

    def _toward_end(self, mask, candidates, work: list[int]) -> int | None:
        """Of a string's candidate tokens, the first after which the string may end (a pattern's or a
        length's rule met), if any."""
        for token in candidates:
            mask.accept(int(token))
            work[0] -= 1
            ends = mask.allowed()[self.enders].any()
            mask.rollback(1)
            if ends:
                return int(token)
        return None

    def close(self, mask, ids: list[int], max_tokens: int, hold: int = HOLD) -> tuple[int, list[int]] | None:
        """Where to rewind a cut answer and how to finish it: ``(kept, path)`` with the first ``kept``
        of ``ids`` and then ``path``, at most ``max_tokens`` in all, keeping as many of the model's
        tokens as possible, at most ``hold`` of them dropped. None when no such point exists, or none was
        found within WORK masks.
        ``mask`` has accepted all of ``ids``; it is left rewound to ``kept`` and advanced by ``path``."""
        n = len(ids)
        work = [WORK]
        states = [VALUE]
        for token in ids:
            states.append(lex(states[-1], self.texts[token]))
        for back in range(min(hold, n) + 1):
            path = self.path(mask, max_tokens - (n - back), states[n - back], work)
            if path is not None:
                for token in path:
                    mask.accept(token)
                return n - back, path
            if back < min(hold, n):
                mask.rollback(1)
        return None
