"""Token selection for the server, step for step the browser's (webruntime/src/sampler.ts):

    logit_bias -> repetition/frequency/presence penalties (over generated tokens), then DRY (over the
    prompt and generated tokens) ->
    grammar mask (disallowed tokens to -inf) -> greedy when temperature is 0, else temperature -> top_k ->
    softmax -> top_p -> draw

with the same seeded xorshift128+ generator, so a seed means the same thing in both runtimes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

_MASK = (1 << 64) - 1


class Rng:
    """xorshift128+ seeded through splitmix64; uniform doubles in [0, 1) with 53 bits."""

    def __init__(self, seed: int):
        x = seed & _MASK

        def splitmix() -> int:
            nonlocal x
            x = (x + 0x9E3779B97F4A7C15) & _MASK
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
            return z ^ (z >> 31)

        self.s0 = splitmix()
        self.s1 = splitmix()

    def next(self) -> float:
        s1, s0 = self.s0, self.s1
        self.s0 = s0
        s1 = (s1 ^ (s1 << 23)) & _MASK
        self.s1 = s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26)
        return (((self.s1 + s0) & _MASK) >> 11) / 2.0**53


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 0.0  # DRY ("don't repeat yourself", llama.cpp's sampler): 0 is off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # tokens it looks back over, the prompt's included; -1: all of them, 0: off
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    top_logprobs: int = -1  # -1: no logprobs


@dataclass
class Sampled:
    token: int
    logprob: float
    top: list[tuple[int, float]]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


class Sampler:
    def __init__(self, p: SamplingParams, prompt: Sequence[int] = ()):
        self.p = p
        self.rng = Rng(p.seed if p.seed is not None else random.getrandbits(52))
        # The penalties' and DRY's window: the prompt and the generated tokens, as llama.cpp's server (the
        # wasm device) counts them; transformers' repetition_penalty counts the prompt too.
        self.counts: dict[int, int] = {}
        if p.repetition_penalty != 1 or p.frequency_penalty or p.presence_penalty:
            for token in prompt:
                self.counts[token] = self.counts.get(token, 0) + 1
        self.history: list[int] = list(prompt) if p.dry_multiplier else []

    def accept(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1
        if self.p.dry_multiplier:
            self.history.append(token)

    def sample(self, raw: np.ndarray, allowed: np.ndarray | None = None) -> Sampled:
        """Choose the next token; ``allowed`` (a grammar's mask) rules out the others before choosing."""
        p = self.p
        logits = raw.astype(np.float32)  # a copy: the caller's logits stay as they were
        for i, b in p.logit_bias.items():
            logits[i] += np.float32(b)
        penalized = p.repetition_penalty != 1 or p.frequency_penalty or p.presence_penalty
        for i, n in self.counts.items() if penalized else ():
            v = float(logits[i])
            if p.repetition_penalty != 1:
                v = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
            logits[i] = np.float32(v - p.frequency_penalty * n - p.presence_penalty)
        if p.dry_multiplier and p.dry_penalty_last_n:
            for i, penalty in dry_penalties(self.history, p).items():
                logits[i] = np.float32(float(logits[i]) - penalty)
        if allowed is not None:
            allowed = allowed[: len(logits)]
            logits[~allowed | np.isnan(logits)] = -np.inf
        with np.errstate(invalid="ignore"):
            token = int(np.argmax(logits)) if p.temperature == 0 else self._draw(logits)
        if allowed is not None and not allowed[token]:
            # only logits that are all -inf or NaN (a broken model) can leave a forbidden token here
            token = int(np.argmax(allowed))
        logprob, top = 0.0, []
        if p.top_logprobs >= 0:
            lp = _log_softmax(logits)
            logprob = float(lp[token])
            if p.top_logprobs > 0:
                top = [(int(i), float(lp[i])) for i in _best(lp, p.top_logprobs)]
        return Sampled(token, logprob, top)

    def _draw(self, logits: np.ndarray) -> int:
        """Temperature, top-k, top-p, draw, without sorting the vocabulary (262,144 entries for
        Gemma 3): top-k and top-p rank only the best candidates (``_best``); with neither, the draw
        walks the distribution in token order. The browser's ``draw`` is this function step for step."""
        p = self.p
        x = logits.astype(np.float64)
        if p.top_k == 0 and p.top_p >= 1:  # the whole distribution: any fixed order draws the same law
            cum = np.cumsum(np.exp((x - _ranked(x).max()) / p.temperature))  # sequential, as the browser adds
            return min(int(np.searchsorted(cum, self.rng.next() * cum[-1], side="right")), len(x) - 1)
        n = p.top_k if p.top_k > 0 else NUCLEUS_START
        total = None
        while True:
            ids = _best(x, n)
            cum = np.cumsum(np.exp((x[ids] - x[ids[0]]) / p.temperature))
            if total is None:  # top-p's share is of the top-k's weight, or of every token's (in token order)
                total = cum[-1] if p.top_k > 0 else np.cumsum(np.exp((x - x[ids[0]]) / p.temperature))[-1]
            keep = len(ids)
            if p.top_p < 1:
                hit = np.nonzero(cum / total >= p.top_p)[0]
                if len(hit):
                    keep = int(hit[0]) + 1
                elif p.top_k == 0 and n < len(x):
                    n *= 8  # the nucleus is wider than the candidates ranked so far
                    continue
            u = self.rng.next() * cum[keep - 1]
            k = int(np.searchsorted(cum[:keep], u, side="right"))
            return int(ids[min(k, keep - 1)])


def dry_penalties(history: list[int], p: SamplingParams) -> dict[int, float]:
    """DRY, as llama.cpp defines it, without sequence breakers: a token that would extend a repeat of
    ``n >= dry_allowed_length`` tokens (the end of ``history``, prompt and generated tokens, seen before
    in it, followed by that token)
    loses ``dry_multiplier * dry_base ** (n - dry_allowed_length)`` of its logit, for the longest such n.
    The repeats are found with the Z-algorithm over the reversed window: linear in its length. The twin
    of dryPenalties in webruntime/src/sampler.ts."""
    window = history[-p.dry_penalty_last_n :] if p.dry_penalty_last_n > 0 else history
    rev = window[::-1]
    n = len(rev)
    if n <= p.dry_allowed_length:
        return {}
    z = [0] * n
    left = right = 0
    longest: dict[int, int] = {}
    for i in range(1, n):
        k = min(right - i, z[i - left]) if i < right else 0
        while i + k < n and rev[k] == rev[i + k]:
            k += 1
        z[i] = k
        if i + k > right:
            left, right = i, i + k
        # rev[i:i+k] equals rev[:k]: the k tokens ending at history position n-1-i repeat the last k,
        # and the token after them (rev[i-1]) would extend the repeat to k+1
        if k >= p.dry_allowed_length and k > longest.get(rev[i - 1], 0):
            longest[rev[i - 1]] = k
    top = int(88.7228391 / math.log(p.dry_base)) if p.dry_base > 1.000001 else math.inf  # llama.cpp's clamp
    return {t: p.dry_multiplier * p.dry_base ** min(k - p.dry_allowed_length, top) for t, k in longest.items()}


NUCLEUS_START = 64  # candidates ranked first for top-p; eight times more while the nucleus is wider


def _ranked(values: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(values), -np.inf, values).astype(np.float64)  # NaN ranks last


def _best(values: np.ndarray, n: int) -> np.ndarray:
    """The ids of the ``n`` largest values, best first, ties broken by the lower id: a partial
    selection, then a sort of the selected only."""
    ranked = _ranked(values)
    if n < len(ranked):
        kth = np.partition(ranked, len(ranked) - n)[len(ranked) - n]
        idx = np.flatnonzero(ranked >= kth)  # ties at the threshold included, cut below
    else:
        idx = np.arange(len(ranked))
    return idx[np.lexsort((idx, -ranked[idx]))][:n]
