"""Run a compiled model library on the CPU: the reference path and the server's engine.

Owns the calling convention of the model library (embed -> prefill/decode with
a paged KV cache, packed params as the last argument) on the Python side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import tvm
from tvm import relax
from tvm.runtime import ShapeTuple

_KV = {
    name: tvm.get_global_func(f"vm.builtin.kv_state_{name}")
    for name in ("add_sequence", "remove_sequence", "begin_forward", "end_forward", "clear", "popn")
}


def _shared(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens of ``prompt`` (its last excepted: it is always run, for its logits)
    ``cached`` already holds."""
    keep = 0
    for have, token in zip(cached, prompt[:-1]):
        if have != token:
            break
        keep += 1
    return keep


class CpuModel:
    """One model library plus its weights, running one sequence at a time.

    The KV cache keeps up to ``conversations`` sequences in the memory of one context window: a
    prompt goes to the one it shares most with (``prefill_reusing``), the others stay cached
    until their pages are needed (least recently used first)."""

    def __init__(
        self,
        library: str | Path,
        params: Sequence[np.ndarray],
        *,
        context_window: int,
        prefill_chunk: int,
        page_size: int = 16,
        conversations: int = 1,
    ):
        self.device = tvm.cpu()
        self.vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), self.device)
        self.params = [tvm.runtime.tensor(p, self.device) for p in params]
        self.prefill_chunk = prefill_chunk
        self.context_window = context_window
        self.page_size = page_size
        self.pages = -(-context_window // page_size)  # what the sequences may hold together
        # a page of slack per sequence: each one's last page is partly empty
        self.kv = self.vm["create_tir_paged_kv_cache"](
            ShapeTuple([conversations]),
            ShapeTuple([(self.pages + conversations) * page_size]),
            ShapeTuple([prefill_chunk]),
            ShapeTuple([page_size]),
            ShapeTuple([0]),
        )
        self.cached: dict[int, list[int]] = {}  # sequence id -> its tokens in the KV cache, in order
        for seq in range(conversations):
            _KV["add_sequence"](self.kv, seq)
            self.cached[seq] = []
        self.recent = list(range(conversations))  # least recently used first
        self.seq_id = 0

    @property
    def tokens(self) -> list[int]:
        """The current sequence's tokens in the KV cache."""
        return self.cached[self.seq_id]

    def call(self, name: str, *args: np.ndarray) -> list[np.ndarray]:
        """Call a library function on numpy arrays; returns its outputs (in-place ones included)."""
        tensors = [tvm.runtime.tensor(np.ascontiguousarray(a), self.device) for a in args]
        out = self.vm[name](*tensors)
        if isinstance(out, tvm.runtime.Tensor):
            return [out.numpy()]
        return [o.numpy() for o in out]

    def reset(self, seq: int | None = None) -> None:
        """Empty a sequence (the current one by default)."""
        seq = self.seq_id if seq is None else seq
        _KV["remove_sequence"](self.kv, seq)
        _KV["add_sequence"](self.kv, seq)
        self.cached[seq] = []

    def _make_room(self, new: int) -> None:
        """Free pages for ``new`` more tokens of the current sequence: other sequences are dropped,
        least recently used first."""

        def pages(n: int) -> int:
            return -(-n // self.page_size)

        need = pages(len(self.tokens) + new)
        for seq in self.recent:
            if sum(pages(len(t)) for s, t in self.cached.items() if s != self.seq_id) + need <= self.pages:
                return
            if seq != self.seq_id:
                self.reset(seq)

    def _forward(self, func: str, tokens: Sequence[int], *extra) -> np.ndarray:
        if len(self.tokens) + len(tokens) > self.context_window:
            raise ValueError(f"context window of {self.context_window} tokens exceeded")
        self._make_room(len(tokens))
        ids = tvm.runtime.tensor(np.asarray(tokens, dtype="int32"), self.device)
        emb = self.vm["embed"](ids, self.params)
        emb = emb._create_view((1, *emb.shape))  # [n, H] -> [1, n, H] without a copy
        _KV["begin_forward"](self.kv, ShapeTuple([self.seq_id]), ShapeTuple([len(tokens)]))
        logits, _ = self.vm[func](emb, *extra, self.kv, self.params)
        _KV["end_forward"](self.kv)
        self.tokens.extend(int(t) for t in tokens)
        return logits.numpy()

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Append ``tokens`` (in chunks) and return the last position's logits ``[V]``."""
        logits = None
        for start in range(0, len(tokens), self.prefill_chunk):
            chunk = tokens[start : start + self.prefill_chunk]
            logits = self._forward("prefill" if len(chunk) > 1 else "decode", chunk)
        assert logits is not None, "prefill of no tokens"  # callers pass one at least (prefill_reusing: the last)
        return logits.reshape(-1)

    def select(self, prompt: Sequence[int]) -> int:
        """Make current the cached sequence ``prompt`` should run on, and return it: the one it
        extends or shares the longest prefix with, if that prefix is at least half the prompt (a
        chat's next turn, the same system prompt with another question); otherwise the least
        recently used one (a new conversation replaces the oldest)."""
        best = max(self.recent[::-1], key=lambda seq: _shared(self.cached[seq], prompt))  # ties: the most recent
        keep = _shared(self.cached[best], prompt)
        if keep < len(self.cached[best]) and 2 * keep < len(prompt):
            best = self.recent[0]
        self.recent.remove(best)
        self.recent.append(best)
        self.seq_id = best
        return best

    def prefill_reusing(self, prompt: Sequence[int]) -> tuple[np.ndarray, int]:
        """Last-position logits of ``prompt`` from wherever the cache is (``select``): the longest
        prefix the chosen sequence shares with it is kept (a repeated prompt, system prompt or chat
        history is not prefilled again), the rest is dropped and the remainder prefilled. The last
        token is always run, for its logits, and as a decode step of its own: TVM's paged KV cache gives
        a chunk's rows other bits than a step's (it merges the chunk's own attention with the cached
        part's), so a repeated prompt, where the last token is all that runs, gets the bits it got the
        first time (the browser's webgpu device does the same). Returns (logits, tokens reused)."""
        self.select(prompt)
        keep = _shared(self.tokens, prompt)
        if keep == 0:
            self.reset()
        elif keep < len(self.tokens):
            _KV["popn"](self.kv, self.seq_id, len(self.tokens) - keep)
            del self.tokens[keep:]
        if len(prompt) - keep > 1:
            self.prefill(prompt[keep:-1])
        return self._forward("decode", prompt[-1:]).reshape(-1), keep

    def all_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Append ``tokens`` and return logits ``[len(tokens), V]`` for every position."""
        rows = []
        for start in range(0, len(tokens), self.prefill_chunk):
            chunk = tokens[start : start + self.prefill_chunk]
            pos = tvm.runtime.tensor(np.arange(len(chunk), dtype="int32"), self.device)
            rows.append(self._forward("batch_prefill", chunk, pos)[0])
        return np.concatenate(rows, axis=0)

    def greedy(self, prompt: Sequence[int], max_tokens: int, stop_ids: Sequence[int] = ()) -> list[int]:
        """Greedy continuation of ``prompt`` from an empty cache."""
        self.reset()
        logits = self.prefill(prompt)
        out: list[int] = []
        while len(out) < max_tokens:
            token = int(np.argmax(logits))
            if token in stop_ids:
                break
            out.append(token)
            if len(out) < max_tokens:
                logits = self._forward("decode", [token]).reshape(-1)
        return out
