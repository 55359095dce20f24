"""The `llamacpp` engine: the artifact's GGUF on llama.cpp (PyPI `llama-cpp-python`, its C API).

llama.cpp runs the forward passes; everything a request sees stays Lantern's (engine.py: template,
tokenizer, sampler, grammar masks, stops), so both engines answer alike. What this module adds:

* **Continuous batching.** One scheduler thread owns the llama.cpp context. Each step it decodes
  the next token of every running sequence in one `llama_decode` call, then each prompt chunk of
  newly admitted ones in a call of its own (up to ``batch_tokens`` in all), and hands each sequence
  its logits row. A request thread samples its token and is back before the next step.
* **Prefix reuse.** Up to ``slots`` sequences (llama.cpp seq ids) keep their tokens in the KV cache
  after their request ends. A new prompt takes the idle slot sharing its longest prefix and prefills
  only the rest; when a running sequence shares a longer prefix, its KV is copied
  (`llama_memory_seq_cp`, no compute) into the idle slot first and cut to that prefix.
* **The same logits whatever else runs.** Each slot has its own KV stream (``kv_unified`` off),
  attention runs without flash attention, and no prompt is fed in a chunk of one token (a cache hit
  recomputes at least the last two, and a prompt chunk gets a llama_decode call of its own, since
  llama.cpp cuts a batch of several sequences into pieces of equal length). Then a sequence's logits
  are bit for bit the same alone or beside others, its prompt found in the cache or prefilled in any
  chunks (tests/test_server.py), and the same request gives the same answer. Measured on SmolLM2,
  llama.cpp's other layouts are not: in one shared KV cache, where the other sequences' cells sit
  changes the attention's sums (up to 0.6 in a logit); its CPU flash attention gives a prompt's last
  token other logits alone than inside a longer chunk (0.55), and other ones again, by up to 25, when
  the chunk holds other sequences' prompts too; and in llama.cpp's default build a lone query row
  rounds differently from a chunk's (0.36: llamafile's sgemm takes chunks), while chunks of two or
  more agree. The cost: every slot reserves its own window of cells (SLOT_TOKENS_BUDGET bounds them),
  and prefill is slower (docs/benchmarks.md: the KV layout).
* **Steps of several tokens** for speculation.py: ``Session.verify`` decodes a sampled token and
  drafts after it in one pass and returns every row. Built without llamafile (ci/setup.sh), llama.cpp
  gives a row the same bits alone or in a chunk, so checked drafts change no answer; the engine
  checks this at load (``rows_exact``) and times steps of 1 to 17 tokens (``pass_costs``).
* **A draft model**, where the artifact carries one (``lantern build --draft``): a second llama.cpp
  context, one KV stream per slot like the model's, run on the scheduler thread too. A step that asks
  for k drafts (``Session.verify(..., draft=k)``) first brings the slot's draft stream up to the
  sequence's tokens (usually the one or two tokens the last step took), then takes the draft model's
  greedy tokens one at a time, several sequences per call, and checks them in the model's pass.

Why the C API and not `llama_cpp.Llama`: that class runs one sequence and samples inside llama.cpp;
batching and Lantern's own sampler and xgrammar masks need the logits of several sequences per call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import LanternError
from .stopping import Stop

# How long the scheduler waits for sequences that just got logits to send their next token before it
# decodes without them. Sampling takes well under a millisecond; a grammar mask or a slow thread more.
GATHER_S = 0.01
# KV cells of all slots together, by default: each slot gets the model's context window, or an equal
# share of this many cells when the windows of all slots would need more (SmolLM2's 4,096-token window
# times 8 slots fits: 32,768 cells, 0.75 GB of f16 KV).
SLOT_TOKENS_BUDGET = 32768
# Steps the engine times at load (tokens in one step): a check of drafts costs what they say (a CPU
# runs small steps through other kernels than large ones, so the cost is not a line).
PROBE_ROWS = (1, 2, 3, 4, 6, 8, 12, 17)
SPECULATION_OFF = (
    "this llama.cpp build rounds a row alone otherwise than in a chunk; "
    "build llama-cpp-python with CMAKE_ARGS=-DGGML_LLAMAFILE=OFF (docs/server.md)"
)
INSTALL_HINT = (
    "pip install 'lantern-llm[llamacpp]' (compiles llama.cpp, ~10 minutes on 2 cores; "
    "with CMAKE_ARGS=-DGGML_LLAMAFILE=OFF speculation is exact and on)"
)


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class _Seq:
    """One request's sequence while it is open: what is left to feed and where its answer goes."""

    slot: int = -1
    todo: list[int] = field(default_factory=list)  # tokens to decode next (prompt rest, or a step's tokens)
    drop: int = 0  # a step's: tokens to remove from the end of its KV first (drafts its answer did not take)
    stepping: bool = False  # past its prompt: each step's tokens all get logits
    draft_k: int = 0  # a step's: drafts to ask the draft model for, after its tokens
    drafted: list[int] = field(default_factory=list)  # the draft model's guesses of its last step
    prompt: list[int] = field(default_factory=list)
    cached: int = 0  # prompt tokens found in the KV cache
    started: float = 0.0  # when its prefill was first scheduled
    logits: np.ndarray | None = None  # the prompt's last row; then (tokens, vocabulary): a step's rows
    error: Exception | None = None
    closed: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class Session:
    """An open sequence, as engine.Generator.generate uses it: the prompt's last logits, how many
    prompt tokens were reused, ``step(token)`` for the next logits, and ``verify`` for several tokens
    at once (speculation.py)."""

    def __init__(self, owner: "LlamaCppEngine", seq: _Seq, stop: Stop):
        self._owner, self._seq, self._stop = owner, seq, stop
        self.drafted: list[int] = []
        assert seq.logits is not None  # open() makes a session once the prompt's logits are in (_wait)
        self.logits, self.cached, self.started = seq.logits, seq.cached, seq.started

    def step(self, token: int) -> np.ndarray:
        return self.verify([token])[0]

    def verify(self, tokens: list[int], drop: int = 0, draft: int = 0) -> np.ndarray:
        """Remove the last ``drop`` tokens from the sequence, append ``tokens`` in one forward pass and
        return the logits after each of them (row i: the next token's after tokens[: i + 1]). A step
        with more tokens than the batch has room for keeps its first ones: fewer rows come back.
        ``draft``: up to that many of the draft model's guesses follow ``tokens`` in the same pass
        (``drafted`` lists them; their rows follow)."""
        rows = self._owner._feed(self._seq, tokens, drop, self._stop, draft)
        self.drafted = list(self._seq.drafted)
        return rows


class LlamaCppEngine:
    """llama.cpp over one GGUF, shared by up to ``slots`` concurrent sequences."""

    name = "llamacpp"

    def __init__(
        self,
        gguf: Path,
        *,
        vocab_size: int,
        context_window: int,
        slots: int = 8,
        threads: int | None = None,
        slot_tokens: int | None = None,
        batch_tokens: int = 512,
        kv_overrides: dict[str, int] | None = None,
        draft: Path | None = None,
    ):
        self.gguf, self.slots = gguf, slots
        self.threads = threads or os.cpu_count() or 1
        # each slot's own KV stream; a request's window is at most one stream (``context_window``)
        self.slot_tokens = slot_tokens or min(context_window, max(256, SLOT_TOKENS_BUDGET // slots // 256 * 256))
        self.context_window = min(context_window, self.slot_tokens)
        self.kv_tokens = self.slot_tokens * slots
        self.batch_tokens = batch_tokens
        self.lc, self.model, self._overrides = load_model(gguf, vocab_size, kv_overrides)
        lc = self.lc
        self.vocab_size = vocab_size
        self.ctx = self._context(self.model, gguf)
        self.mem = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(batch_tokens, 0, 1)
        # the draft model (speculation.py's "draft" source): its own context, a stream per slot
        self.draft, self.dmodel, self.dctx, self.dbatch = draft, None, None, None
        self.dkv: list[list[int]] = [[] for _ in range(slots)]  # each slot's tokens in the draft's KV cache
        self.draft_cost: float | None = None  # a draft step over a model step (_probe_draft, then as run)
        self._one_step = 0.0  # a model step of one token, seconds (_probe_rows, then as run)
        if draft is not None:
            try:
                _, self.dmodel, _ = load_model(draft, vocab_size, what="the draft model")
                self.dctx = self._context(self.dmodel, draft)
            except LanternError:
                lc.llama_batch_free(self.batch)
                lc.llama_free(self.ctx)
                self._free()
                raise
            self.dmem = lc.llama_get_memory(self.dctx)
            self.dbatch = lc.llama_batch_init(batch_tokens, 0, 1)
        self.kv: list[list[int]] = [[] for _ in range(slots)]  # each slot's tokens in the KV cache
        self.busy: list[_Seq | None] = [None] * slots
        self.last_used = [0.0] * slots
        self.waiting: deque[_Seq] = deque()
        self.sampling: set[int] = set()  # ids of sequences holding fresh logits, choosing their next token
        self.decoded_at = 0.0
        self.cv = threading.Condition()
        self.stopped = False
        self.peak_batch = 0  # most sequences one llama_decode call has served (/metrics)
        self.pass_costs, self.rows_exact = [1.0], False  # _probe_rows, on the scheduler thread
        self.probe_error: Exception | None = None
        probed = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(probed,), daemon=True, name="llamacpp-scheduler")
        self.thread.start()
        probed.wait()
        if self.stopped:  # the probe failed: the scheduler has ended
            self.close()
            raise LanternError(f"llama.cpp could not run {gguf.name}: {self.probe_error}")

    def _context(self, model, gguf: Path):
        """A context for ``model`` in the layout whose logits repeat (the module's header): one KV
        stream per slot and plain attention."""
        lc = self.lc
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = self.kv_tokens, self.batch_tokens, self.batch_tokens
        cp.n_seq_max, cp.kv_unified = self.slots, False
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = lc.llama_init_from_model(model, cp)
        if not ctx:
            raise LanternError(f"llama.cpp could not create a context of {self.kv_tokens} tokens for {gguf.name}")
        return ctx

    def describe(self) -> str:
        speculation = "speculation on" if self.rows_exact else f"speculation off: {SPECULATION_OFF}"
        if self.rows_exact and self.draft is not None:
            speculation += f", draft model {self.draft.name} (a step {self.draft_cost:.2f}x the model's)"
        return (
            f"llamacpp ({self.gguf.name}, {self.slots} parallel sequences of up to {self.slot_tokens} tokens, "
            f"{self.threads} threads, {speculation})"
        )

    def _probe_rows(self, reps: int = 3) -> tuple[list[float], bool, float]:
        """(costs, exact, seconds) of checking drafts (speculation.py). costs[r - 1]: the time of a step of r
        tokens (r up to PROBE_ROWS[-1]) over a step of one, the median of ``reps`` steps of each size in
        PROBE_ROWS, in between interpolated. exact: whether the first row of a longer step has the
        one-token step's logits, bit for bit; llama.cpp built with llamafile's sgemm (GGML_LLAMAFILE, on
        by default) rounds a lone row otherwise, and speculation would then change answers. seconds: a
        one-token step's time."""
        runs = {rows: [self._timed_step(self.ctx, self.mem, self.batch, rows) for _ in range(reps)] for rows in PROBE_ROWS}
        self.lc.llama_memory_seq_rm(self.mem, 0, -1, -1)
        median = {rows: sorted(s for s, _ in got)[reps // 2] for rows, got in runs.items()}
        costs = np.interp(np.arange(1, PROBE_ROWS[-1] + 1), PROBE_ROWS, [median[r] / median[1] for r in PROBE_ROWS])
        return [float(c) for c in costs], bool(np.array_equal(runs[1][0][1], runs[2][0][1])), median[1]

    def _probe_draft(self, one: float, reps: int = 5) -> float:
        """A one-token step of the draft model over ``one``, the model's (median of ``reps``)."""
        runs = sorted(self._timed_step(self.dctx, self.dmem, self.dbatch, 1)[0] for _ in range(reps))
        self.lc.llama_memory_seq_rm(self.dmem, 0, -1, -1)
        return runs[reps // 2] / one

    def _timed_step(self, ctx, mem, b, rows: int) -> tuple[float, np.ndarray]:
        """(seconds, first row's logits) of a step of ``rows`` tokens on slot 0 after 8 tokens of
        context (made on the first call), rolled back after."""
        lc = self.lc

        def step(tokens: list[int], pos: int) -> float:
            _fill(b, [(0, tokens, pos, len(tokens))])
            began = time.perf_counter()
            if lc.llama_decode(ctx, b) != 0:
                gguf = self.gguf if ctx is self.ctx else self.draft or self.gguf
                raise LanternError(f"llama.cpp could not decode {gguf.name}")
            return time.perf_counter() - began

        if lc.llama_memory_seq_pos_max(mem, 0) < 7:
            step(list(range(1, 9)), 0)
        seconds = step(list(range(9, 9 + rows)), 8)
        first = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, 0), shape=(self.vocab_size,)).copy()
        lc.llama_memory_seq_rm(mem, 0, 8, -1)
        return seconds, first

    # -- request side (any thread) --------------------------------------------------------------

    @contextlib.contextmanager
    def open(self, prompt: list[int], stop: Stop | None = None) -> Iterator[Session]:
        """Admit ``prompt`` (waits for a free slot), prefill what the cache lacks, yield the session;
        leaving frees the slot and keeps its tokens cached for the next prompt that shares them.
        ``stop`` raises Stopped (stopping.py) while it waits: a request that must end leaves the
        queue, or its prefill between two chunks, at once."""
        seq, stop = _Seq(prompt=list(prompt)), stop or Stop()
        with self.cv:
            self.waiting.append(seq)
            self.cv.notify()
        try:
            self._wait(seq, stop)
            yield Session(self, seq, stop)
        finally:
            with self.cv:
                seq.closed = True
                self.sampling.discard(id(seq))
                self.cv.notify()

    def _feed(self, seq: _Seq, tokens: list[int], drop: int, stop: Stop, draft: int = 0) -> np.ndarray:
        with self.cv:
            seq.todo, seq.drop, seq.stepping = list(tokens), drop, True
            seq.draft_k = draft if self.dctx is not None else 0
            seq.drafted = []
            seq.done.clear()
            self.sampling.discard(id(seq))
            self.cv.notify()
        return self._wait(seq, stop)

    def _wait(self, seq: _Seq, stop: Stop) -> np.ndarray:
        stop.wait(seq.done)  # the caller's open() marks the sequence closed if this raises
        if seq.error is not None:
            raise seq.error
        assert seq.logits is not None  # done without an error: _decode set the logits first
        return seq.logits

    def close(self) -> None:
        """Fail what is still open, stop the scheduler and free llama.cpp's memory (once)."""
        with self.cv:
            self.stopped = True
            self.cv.notify()
        self.thread.join(10)
        if self.ctx is None:
            return
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.ctx = None
        self._free()

    def _free(self) -> None:
        """The models, and the draft's context."""
        lc = self.lc
        if self.dbatch is not None:
            lc.llama_batch_free(self.dbatch)
        if self.dctx is not None:
            lc.llama_free(self.dctx)
        if self.dmodel is not None:
            lc.llama_model_free(self.dmodel)
        lc.llama_model_free(self.model)
        self.dbatch = self.dctx = self.dmodel = None

    # -- scheduler thread ----------------------------------------------------------------------

    def _run(self, probed: threading.Event) -> None:
        # Only this thread calls llama_decode: once two threads have, llama.cpp's OpenMP build runs each
        # call 2.7x slower (measured on 2 cores: 9 ms a token from one thread, 26 ms after another's call).
        try:
            self.pass_costs, self.rows_exact, self._one_step = self._probe_rows()
            if self.dctx is not None:
                self.draft_cost = self._probe_draft(self._one_step)
        except Exception as err:  # noqa: BLE001 (the constructor raises it, naming the model)
            self.probe_error = err
            self.stopped = True
        finally:
            probed.set()
        try:
            while True:
                with self.cv:
                    while not self.stopped and not self._ready():
                        self.cv.wait(self._patience())
                    if self.stopped:
                        self._fail_all(LanternError("the server is shutting down"))
                        return
                    self._release_closed()
                    self._admit()
                    plan = self._plan()
                if plan:
                    self._decode(plan)
        except Exception as err:  # never leave a request waiting on a dead scheduler
            with self.cv:
                self.stopped = True
                self._fail_all(LanternError(f"llama.cpp scheduler failed: {type(err).__name__}: {err}"))
            raise

    def _fail_all(self, error: Exception) -> None:
        for seq in [*self.busy, *self.waiting]:
            if seq is not None:
                seq.error = error
                seq.done.set()

    def _ready(self) -> bool:
        """Work to do, and every sequence that just got logits has chosen its next token (or took too
        long): waiting for them is what keeps each llama_decode call batched."""
        return self._has_work() and (not self.sampling or time.perf_counter() - self.decoded_at > GATHER_S)

    def _patience(self) -> float | None:
        return max(0.0, GATHER_S - (time.perf_counter() - self.decoded_at)) + 1e-4 if self.sampling else None

    def _has_work(self) -> bool:
        return any(s is not None and (s.closed or s.todo) for s in self.busy) or (
            bool(self.waiting) and (None in self.busy or any(s is not None and s.closed for s in self.busy))
        )

    def _release_closed(self) -> None:
        for i, seq in enumerate(self.busy):
            if seq is not None and seq.closed:
                self.busy[i] = None
                self.last_used[i] = time.monotonic()
        while self.waiting and self.waiting[0].closed:
            self.waiting.popleft()

    def _admit(self) -> None:
        """Give waiting prompts free slots, reusing the longest cached prefix."""
        lc = self.lc
        while self.waiting and None in self.busy:
            seq = self.waiting.popleft()
            if seq.closed:
                continue
            prompt = seq.prompt
            free = [i for i, s in enumerate(self.busy) if s is None]
            shared = [_common_prefix(self.kv[i], prompt) for i in range(self.slots)]
            slot = max(free, key=lambda i: (shared[i], -self.last_used[i]))
            donor = max(range(self.slots), key=lambda i: shared[i])
            if shared[donor] > shared[slot]:  # a running sequence holds more of this prompt: copy its KV
                lc.llama_memory_seq_rm(self.mem, slot, -1, -1)
                # between streams llama.cpp copies a whole sequence only (a range aborts the process)
                lc.llama_memory_seq_cp(self.mem, donor, slot, -1, -1)
                lc.llama_memory_seq_rm(self.mem, slot, shared[donor], -1)
                self.kv[slot] = self.kv[donor][: shared[donor]]
                shared[slot] = shared[donor]
            # the last two prompt tokens always run: their logits, and never a chunk of one (_plan)
            keep = max(0, min(shared[slot], len(prompt) - 2))
            if not lc.llama_memory_seq_rm(self.mem, slot, keep, -1):
                lc.llama_memory_seq_rm(self.mem, slot, -1, -1)
                keep = 0
            del self.kv[slot][keep:]
            seq.slot, seq.cached, seq.todo = slot, keep, prompt[keep:]
            self.busy[slot] = seq

    def _plan(self) -> list[tuple[_Seq, list[int]]]:
        """This step's batch: every running sequence's step first, then prompt chunks."""
        room, plan = self.batch_tokens, []
        running = [s for s in self.busy if s is not None and not s.closed and s.todo]
        steps = [s for s in running if s.stepping]
        for i, seq in enumerate(steps):
            if seq.drop:  # the drafts its answer did not take leave the KV cache
                kept = len(self.kv[seq.slot]) - seq.drop
                self.lc.llama_memory_seq_rm(self.mem, seq.slot, kept, -1)
                del self.kv[seq.slot][kept:]
                seq.drop = 0
            # each step keeps at least its first token; drafts beyond its share of the batch go unchecked
            share = max(1, (room - (len(steps) - i - 1)) // (len(steps) - i))
            take = seq.todo[: min(len(seq.todo), share)]
            seq.todo = []
            seq.draft_k = max(0, min(seq.draft_k, share - len(take)))  # the draft model's, made in _decode
            plan.append((seq, take))
            room -= len(take) + seq.draft_k
        for seq in (s for s in running if not s.stepping):
            take = seq.todo[:room]
            if 1 < len(seq.todo) and len(seq.todo) - len(take) == 1:
                take = take[:-1]  # a prompt's chunks hold two tokens or more (the module's header)
            if not take or (len(take) < 2 and len(seq.todo) > 1):
                break
            del seq.todo[: len(take)]
            seq.started = seq.started or time.perf_counter()
            plan.append((seq, take))
            room -= len(take)
        return plan

    def _decode(self, plan: list[tuple[_Seq, list[int]]]) -> None:
        """One llama_decode for the step's decoding sequences, one for each prompt chunk. Given several
        sequences, llama.cpp cuts a batch into pieces of as many tokens of each (its split_equal), so a
        prompt chunk beside a step would run partly as a chunk of one (the module's header)."""
        steps = [item for item in plan if item[0].stepping]
        drafting = [item for item in steps if item[0].draft_k]
        began = time.perf_counter()
        calls = self._draft(drafting) if drafting else 0
        drafted = time.perf_counter()
        for group in ([steps] if steps else []) + [[item] for item in plan if not item[0].stepping]:
            self._decode_group(group)
        if calls and len(steps) == len(plan) == 1:
            self._observe_draft((drafted - began) / calls, time.perf_counter() - drafted, len(steps[0][1]))

    def _observe_draft(self, draft_step: float, model_step: float, rows: int) -> None:
        """Update ``draft_cost`` from a pass as run: a draft step's seconds over a one-token model step's
        (``model_step`` took ``rows`` tokens; pass_costs scales it to one). As run, a draft step cost
        about 1.45x what the load-time probe measured (SmolLM2, 2 cores: the two contexts take turns)."""
        self._one_step = 0.9 * self._one_step + 0.1 * model_step / self.pass_costs[min(rows, len(self.pass_costs)) - 1]
        self.draft_cost = 0.9 * (self.draft_cost or 0.0) + 0.1 * draft_step / self._one_step

    def _decode_group(self, plan: list[tuple[_Seq, list[int]]]) -> None:
        lc, b = self.lc, self.batch
        total, outputs, entries = 0, list[tuple[_Seq, int, int]](), []  # outputs: (sequence, first row, rows)
        for seq, tokens in plan:
            rows = len(tokens) if seq.stepping else int(not seq.todo)  # a prompt's last row only
            outputs.append((seq, total, rows))
            entries.append((seq.slot, tokens, len(self.kv[seq.slot]), rows))
            total += rows
        _fill(b, entries)
        self.peak_batch = max(self.peak_batch, len(plan))
        rc = lc.llama_decode(self.ctx, b)  # a slot's stream holds a whole window: there is always room
        with self.cv:
            if rc != 0:
                why = "its KV cache is full" if rc == 1 else f"llama_decode returned {rc}"
                for seq, _ in plan:  # these sequences' state is unknown now: end them and forget their cache
                    lc.llama_memory_seq_rm(self.mem, seq.slot, -1, -1)
                    self.kv[seq.slot] = []
                    seq.todo = []
                    seq.error = LanternError(f"llama.cpp could not decode: {why}")
                    seq.done.set()
                return
            for seq, tokens in plan:
                self.kv[seq.slot].extend(tokens)
            logits = np.ctypeslib.as_array(lc.llama_get_logits(self.ctx), shape=(total, self.vocab_size)) if total else None
            for seq, first, rows in outputs:
                if not rows:
                    continue
                assert logits is not None
                seq.logits = logits[first : first + rows].copy() if seq.stepping else logits[first].copy()
                if not seq.closed:
                    self.sampling.add(id(seq))
                seq.done.set()
            self.decoded_at = time.perf_counter()

    def _draft(self, items: list[tuple[_Seq, list[int]]]) -> int:
        """Append up to ``seq.draft_k`` of the draft model's greedy tokens to each step's tokens (and
        to ``seq.drafted``). Each slot's draft stream first takes the tokens it lacks of the sequence's
        (a new prompt, or the tokens the last step took); a draft that fails leaves the step as it was.
        Returns the draft model's steps (0 where a prompt was fed: not a step's cost)."""
        lc = self.lc
        feeds = []
        for seq, tokens in items:
            target = self.kv[seq.slot] + tokens
            have = self.dkv[seq.slot]
            common = min(_common_prefix(have, target), len(target) - 1)  # the last one runs: its logits
            if not lc.llama_memory_seq_rm(self.dmem, seq.slot, common, -1):
                lc.llama_memory_seq_rm(self.dmem, seq.slot, -1, -1)
                common = 0
            del have[common:]
            feeds.append((seq, target[common:]))
        short = [(seq, feed) for seq, feed in feeds if len(feed) <= 8]
        rows = dict(zip((id(seq) for seq, _ in short), self._draft_decode(short))) if short else {}
        calls, fed = int(bool(short)), False
        for seq, feed in feeds:
            if len(feed) > 8:  # a prompt: in chunks, a call each
                for start in range(0, len(feed), self.batch_tokens):
                    rows[id(seq)] = self._draft_decode([(seq, feed[start : start + self.batch_tokens])])[0]
                fed = True
        active = [seq for seq, _ in items]
        while active:
            for seq in active:
                row = rows.get(id(seq))
                if row is None:  # its draft failed
                    seq.draft_k = len(seq.drafted)
                else:
                    seq.drafted.append(int(np.argmax(row)))
            active = [seq for seq in active if len(seq.drafted) < seq.draft_k]
            if active:
                rows = dict(zip((id(s) for s in active), self._draft_decode([(s, s.drafted[-1:]) for s in active])))
                calls += 1
        for seq, tokens in items:
            tokens.extend(seq.drafted)
            seq.draft_k = 0
        return 0 if fed else calls

    def _draft_decode(self, entries: list[tuple[_Seq, list[int]]]) -> list[np.ndarray | None]:
        """One llama_decode of the draft model: each entry's tokens appended to its slot's draft stream;
        the logits after each entry's last token (None for all where the call fails, and the streams
        are emptied)."""
        lc, b = self.lc, self.dbatch
        assert b is not None  # only an engine with a draft model drafts
        _fill(b, [(seq.slot, tokens, len(self.dkv[seq.slot]), 1) for seq, tokens in entries])
        if lc.llama_decode(self.dctx, b) != 0:
            for seq, _ in entries:
                lc.llama_memory_seq_rm(self.dmem, seq.slot, -1, -1)
                self.dkv[seq.slot] = []
            return [None] * len(entries)
        logits = np.ctypeslib.as_array(lc.llama_get_logits(self.dctx), shape=(len(entries), self.vocab_size))
        for seq, tokens in entries:
            self.dkv[seq.slot].extend(tokens)
        return [row.copy() for row in logits]


def _fill(b, entries: list[tuple[int, list[int], int, int]]) -> None:
    """Put ``entries`` in the llama_batch ``b``: each (slot, tokens, position of the first, rows), the
    tokens in order at their positions in the slot's sequence, logits asked for the last ``rows``."""
    n = 0
    for slot, tokens, pos, rows in entries:
        for j, tok in enumerate(tokens):
            b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = tok, pos + j, 1, j >= len(tokens) - rows
            b.seq_id[n][0] = slot
            n += 1
    b.n_tokens = n


def load_model(gguf: Path, vocab_size: int, kv_overrides: dict[str, int] | None = None, what: str = "the model"):
    """(llama_cpp, the model, the override array to keep alive) of ``gguf`` on the CPU, checked to have
    the artifact's ``vocab_size`` tokens; LanternError naming the problem (and ``what`` it is) otherwise."""
    try:
        import llama_cpp as lc
    except ImportError:
        raise LanternError(f"the llamacpp engine needs llama-cpp-python: {INSTALL_HINT}") from None
    quiet_logs(lc)
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.n_gpu_layers = 0
    overrides = None
    if kv_overrides:  # the manifest's integer keys (models/family.py: GGUFLayout.load_overrides)
        overrides = (lc.llama_model_kv_override * (len(kv_overrides) + 1))()  # a null key ends it
        for slot, (key, value) in zip(overrides, kv_overrides.items()):
            slot.key, slot.tag, slot.value.val_i64 = key.encode(), lc.LLAMA_KV_OVERRIDE_TYPE_INT, int(value)
        mp.kv_overrides = overrides
    model = lc.llama_model_load_from_file(str(gguf).encode(), mp)
    if not model:
        raise LanternError(f"llama.cpp could not load {what}, {gguf.name} (is it a GGUF llama.cpp supports?)")
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    if n_vocab != vocab_size:
        lc.llama_model_free(model)
        raise LanternError(
            f"{what}, {gguf.name}, has {n_vocab} tokens, the artifact's tokenizer {vocab_size}: rebuild the artifact"
        )
    return lc, model, overrides


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


_LOG_CALLBACK = None


def quiet_logs(lc) -> None:
    """llama.cpp prints every load step to stderr; keep only its errors."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:

        def log(level, text, _user):
            if level == 4:  # GGML_LOG_LEVEL_ERROR (not the loader's progress dots)
                os.write(2, text)

        _LOG_CALLBACK = lc.llama_log_callback(log)
        lc.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
