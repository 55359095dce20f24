"""Speculative decoding in the llamacpp engine: guesses of the next tokens, checked in one forward pass.

Three sources of guesses (drafts), the first two needing no second model:

* ``grammar``: the text a response_format or tool grammar forces next (xgrammar's jump-forward
  string: a key name, the punctuation after it, the rest of an enum value), tokenized as the model
  writes text;
* ``lookup``: prompt lookup, the tokens that followed the latest earlier occurrence of the last 3, 2
  or 1 tokens of the prompt and the answer so far (an answer that quotes its context);
* ``draft``: a small model of the same vocabulary that the artifact carries (``lantern build --draft``,
  e.g. a 4-bit copy of an unquantized model), its greedy next tokens (the engine runs it: llamacpp.py).

The engine still samples every position from the model's own logits, with the grammar's mask and the
penalties, exactly as without speculation; a draft is kept only when the token sampled at its place
is that draft. For a draft of one fixed token this is speculative sampling's acceptance rule (keep it
with probability p(draft), else draw from the rest of p), so the distribution is the model's. And as
llama.cpp gives a position the same logits whether its row runs alone or among others (the
llamacpp module's header), the answer at temperature 0, or with a seed at any temperature, is token
for token the one without speculation (tests/test_speculation.py).

How many to guess: the k that maximizes the tokens expected per unit of time,
(1 + a + a^2 + ... + a^k) / (cost(k + 1) + k * c), where a is the acceptance rate of that kind of draft so
far in this request (from a prior), cost(r) the time of a step of r tokens over a step of one, which the
engine measures at load (SmolLM2 q4 on 2 CPU cores: 1.55 for 2 tokens, 2.0 for 3 or 4, 3.2 for 8: small
models on a CPU are compute-bound; unquantized, 1.17 for 2 and 1.4 for 4), and c what a draft costs to
make (0 for the grammar's and lookup's, a step of the draft model over one of the model's for a draft
model's). Where no k pays, k is 0: no speculation. Where several sources could guess, the one with the
best expected gain does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

SOURCES = ("grammar", "lookup", "draft")
# What each kind of draft is believed to get accepted before a request shows it: (accepted, rejected).
# A grammar's forced text is the model's text but for the tokenization at its edges; a lookup draft is
# a guess, the better the longer the tail it matched (lookup1..lookup3: a tail of 1 to 3 tokens); a 4-bit
# draft of SmolLM2 picks its unquantized build's greedy token 82% of the time (ci/bench/bench_speculation.py).
PRIOR = {"grammar": (8.0, 1.0), "lookup1": (1.0, 2.0), "lookup2": (2.0, 1.0), "lookup3": (3.0, 1.0), "draft": (4.0, 1.0)}
NGRAM = 3  # the longest tail prompt lookup matches


def forced_drafts(tokenizer, text: str, before: str) -> list[int]:
    """The tokens of ``text``, which a grammar forces after ``before`` (the answer's last token), as the
    model writes them: the pieces of the tokenizer's pre-tokenizer whose both edges are fixed. The last
    piece may merge with the free text after it (` [` then `{` is written ` [{`), so it is left out; and
    text that goes on with a word the model began (`r`, then `ounds`) is left to the model, which splits
    such a word its own way (`oun`, `ds`). On 26 of SmolLM2's JSONSchemaBench answers, guesses of whole
    forced strings were kept at 76%, of these pieces at 81% (ci/bench/bench_speculation.py)."""
    if not text or (before[-1:].isalnum() and text[0].isalnum()):
        return []
    if tokenizer.pre_tokenizer is None:  # no pieces to go by: all but the last token
        return tokenizer.encode(text, add_special_tokens=False).ids[:-1]
    pieces = tokenizer.pre_tokenizer.pre_tokenize_str(text)
    if len(pieces) < 2:
        return []
    return tokenizer.encode(text[: pieces[-1][1][0]], add_special_tokens=False).ids


class Verifier(Protocol):
    drafted: list[int]  # the draft model's guesses the last ``verify(..., draft=k)`` checked

    def verify(self, tokens: list[int], drop: int = 0, draft: int = 0) -> np.ndarray: ...


def best_k(rate: float, costs: list[float], most: int, each: float = 0.0) -> int:
    """The number of drafts, at most ``most``, that maximizes (1 + a + ... + a^k) / (cost(k + 1 tokens) +
    k * each), where ``costs[r - 1]`` is the time of a step of r tokens over one of a single token and
    ``each`` what making one draft costs, in the same unit."""
    return _best(rate, costs, most, each)[0]


def _best(rate: float, costs: list[float], most: int, each: float = 0.0) -> tuple[int, float]:
    """(best_k's k, its tokens per unit of time over a plain step's)."""
    best, best_gain, tokens, term = 0, 1.0, 1.0, 1.0
    for k in range(1, min(most, len(costs) - 1) + 1):
        term *= rate
        tokens += term
        gain = tokens / (costs[k] + k * each)
        if gain > best_gain:
            best, best_gain = k, gain
    return best, best_gain


class Lookup:
    """Prompt lookup: for each n-gram (n <= NGRAM) of the text so far, where it last ended."""

    def __init__(self, tokens: list[int]):
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}
        for token in tokens:
            self.push(token)

    def push(self, token: int) -> None:
        h = self.tokens
        for n in range(1, min(NGRAM, len(h)) + 1):  # the n-grams ending here are now followed by ``token``
            self.after[tuple(h[len(h) - n :])] = len(h)
        h.append(token)

    def match(self) -> tuple[int, int]:
        """(n, end): the longest tail seen before (n tokens, 0: none) and where its latest occurrence ended."""
        h = self.tokens
        for n in range(min(NGRAM, len(h)), 0, -1):
            end = self.after.get(tuple(h[len(h) - n :]))
            if end is not None:
                return n, end
        return 0, 0

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest matching tail."""
        n, end = self.match()
        return self.tokens[end : end + k] if n else []


@dataclass
class Counts:
    proposed: int = 0  # drafts decoded
    accepted: int = 0  # drafts the answer took
    hits: float = 0.0  # evidence for the acceptance rate (a prior, then this request's checks)
    misses: float = 0.0

    @property
    def rate(self) -> float:
        return self.hits / (self.hits + self.misses)


@dataclass
class Speculation:
    """One request's speculation over an open engine session. The generator pushes every token the answer
    takes, then asks ``next_logits`` for the logits after it: a row already decoded when that token
    was a draft, else one forward pass over the token and new drafts."""

    session: Verifier
    mode: str
    max_drafts: int
    pass_costs: list[float]  # the time of a step of r tokens over a step of one, at r - 1 (the engine's probe)
    prompt: list[int]
    forced: Callable[[int], list[int]] | None = None  # drafts from the grammar, given the last token (None: none)
    draft_cost: float | None = None  # a step of the draft model over one of the model's (None: no draft model)
    passes: int = 0  # forward passes after the prompt's
    counts: dict[str, Counts] = field(init=False)  # per kind of draft (PRIOR's keys)
    _ahead: deque = field(init=False, default_factory=deque)  # (draft, logits after it) beyond the answer
    _kind: str = field(init=False, default="")  # the kind of the drafts ahead

    def __post_init__(self):
        self.counts = {kind: Counts(hits=hits, misses=misses) for kind, (hits, misses) in PRIOR.items()}
        # auto: the grammar's guesses under a grammar, lookup without one, and a draft model's (where the
        # artifact has one) when they are worth more. Lookup under a JSON schema matched the schema's own
        # text in the prompt, kept 30% of its guesses and cost 16% (docs/benchmarks.md); ask for
        # "lookup" where a JSON answer quotes its context.
        lookup = self.mode == "lookup" or (self.mode == "auto" and self.forced is None)
        self.lookup = Lookup(self.prompt) if lookup else None
        if self.mode in ("lookup", "draft"):
            self.forced = None
        if self.mode in ("grammar", "lookup"):
            self.draft_cost = None

    def push(self, token: int) -> None:
        if self.lookup is not None:
            self.lookup.push(token)

    def next_logits(self, token: int, room: int) -> np.ndarray:
        """The logits after ``token`` (pushed, and taken by the answer); ``room``: tokens the answer may
        still take after it (drafts beyond are not proposed)."""
        drop = 0
        if self._ahead:
            draft, row = self._ahead.popleft()
            counts = self.counts[self._kind]
            if draft == token:
                counts.accepted += 1
                counts.hits += 1
                return row
            counts.misses += 1
            drop = 1 + len(self._ahead)  # that draft and the ones after it leave the KV cache
            self._ahead.clear()
        drafts, model_k = self._propose(min(room - 1, self.max_drafts), token)
        rows = self.session.verify([token, *drafts], drop, model_k)
        if model_k:
            drafts = self.session.drafted
        self.passes += 1
        taken = drafts[: len(rows) - 1]  # a full batch checks fewer
        if taken:
            self.counts[self._kind].proposed += len(taken)
        self._ahead.extend(zip(taken, rows[1:]))
        return rows[0]

    def _propose(self, most: int, last: int) -> tuple[list[int], int]:
        """(drafts, k): this pass's guesses from the grammar or lookup, or k > 0: ask the draft model for
        k (the engine makes them in the same pass)."""
        if most <= 0:
            return [], 0
        if self.forced is not None:
            k = best_k(self.counts["grammar"].rate, self.pass_costs, most)
            drafts = self.forced(last)[:k] if k else []
            if drafts:
                self._kind = "grammar"
                return drafts, 0
        found, best_gain = [], 1.0
        if self.lookup is not None:
            n, end = self.lookup.match()
            if n:
                k, best_gain = _best(self.counts[f"lookup{n}"].rate, self.pass_costs, most)
                if k:
                    self._kind, found = f"lookup{n}", self.lookup.tokens[end : end + k]
        if self.draft_cost is not None:
            k, gain = _best(self.counts["draft"].rate, self.pass_costs, most, self.draft_cost)
            if k and gain > best_gain:
                self._kind = "draft"
                return [], k
        return found, 0

    def usage(self) -> dict:
        """usage.speculation: each source's drafts decoded and taken, and the forward passes."""
        out: dict = {}
        for source in SOURCES:
            kinds = [c for kind, c in self.counts.items() if kind.startswith(source)]
            out[source] = {"proposed": sum(c.proposed for c in kinds), "accepted": sum(c.accepted for c in kinds)}
        out["forward_passes"] = self.passes
        return out
