"""The server's generator: one artifact with the browser engine's semantics, on one of two engines.

Same chat template, tokenizer, sampler, stop handling and usage figures as
webruntime/src/engine.ts. The forward passes come from the server's two engines:

* ``tvm``: the artifact's CPU library (TVM), one sequence at a time, the reference;
* ``llamacpp``: the artifact's GGUF on llama.cpp (llamacpp.py), several sequences batched together.

Generation is blocking work, so each request runs on a worker thread; the FastAPI layer queues
requests in front of the generator.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .. import request_rules
from ..runtime.artifact import Artifact
from ..chat_template import render
from ..errors import LanternError
from ..package import GENERATION_FIELDS
from . import llamacpp
from .protocol import ChatCompletionRequest, FinishReason, SamplingFields, SpeculationUsage, TokenLogprob, TopLogprob, Usage
from .reasoning import held_back
from .closing import HOLD, Closer
from .sampler import Sampled, Sampler, SamplingParams
from .speculation import Speculation, forced_drafts
from .stopping import Stop, Stopped
from .grammars import GrammarCompiler, Mask
from .structured import GrammarSpec, tool_messages
from .xgrammar_wasm import build_description


class InvalidRequest(LanternError):
    """A request the model cannot serve as asked (HTTP 400)."""


@dataclass
class Step:
    delta: str
    logprobs: list[TokenLogprob] | None
    finish: FinishReason | None = None
    usage: Usage | None = None  # on the terminal step (None: stopped before it started)
    stopped: str | None = None  # terminal step: the Stop reason that ended it, if one did
    unused: int = 0  # terminal step of a stopped request: tokens it was allowed and never generated
    late: int = 0  # terminal step: tokens sampled after its client had gone (0 or 1)


def sampling_params(req: SamplingFields, vocab_size: int, defaults: dict) -> SamplingParams:
    """A request's sampling: each field from the request, else the artifact's ``defaults`` (lantern.json
    "generation"), else OpenAI's. The twin of samplingParams in webruntime/src/sampler.ts."""
    bias = {}
    for k, v in (req.logit_bias or {}).items():
        if int(k) >= vocab_size:
            raise InvalidRequest(request_rules.message("token_outside_vocabulary", token=k, last=vocab_size - 1))
        bias[int(k)] = v

    def pick(name: str):
        value = getattr(req, name)
        return value if value is not None else defaults.get(name, GENERATION_FIELDS[name][0])

    return SamplingParams(
        temperature=pick("temperature"),
        top_p=pick("top_p"),
        top_k=min(pick("top_k"), vocab_size),
        repetition_penalty=pick("repetition_penalty"),
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        dry_multiplier=dry_multiplier(req),
        dry_base=req.dry_base,
        dry_allowed_length=req.dry_allowed_length,
        dry_penalty_last_n=req.dry_penalty_last_n,
        logit_bias=bias,
        seed=req.seed,
        top_logprobs=(req.top_logprobs or 0) if req.logprobs else -1,
    )


def dry_multiplier(req: SamplingFields) -> float:
    """The request's dry_multiplier; absent, its schema_defaults.dryMultiplier when it answers under a
    response_format (JSON from the first token, where a small model repeats itself until max_tokens),
    else 0. The twin of dryMultiplier in webruntime/src/sampler.ts."""
    if req.dry_multiplier is not None:
        return req.dry_multiplier
    if isinstance(req, ChatCompletionRequest) and _answers_json(req):
        return req.schema_defaults.dryMultiplier
    return 0.0


def _answers_json(req: SamplingFields) -> bool:
    """Whether the request asks for JSON through response_format (a chat request's field)."""
    fmt = req.response_format if isinstance(req, ChatCompletionRequest) else None
    return fmt is not None and fmt.type in ("json_schema", "json_object")


def closes_cut_answers(req: SamplingFields, hold_from: str | None, params: SamplingParams) -> bool:
    """Whether an answer that max_tokens cuts is closed to stay valid (closing.py): a response_format
    JSON answer without logprobs (a closing token has none). The twin of closesCutAnswers in
    webruntime/src/closing.ts."""
    return hold_from is None and params.top_logprobs < 0 and _answers_json(req)


ENGINES = ("auto", "llamacpp", "tvm")


class TvmSession:
    def __init__(self, model, prompt: list[int]):
        self.started = time.perf_counter()
        self.logits, self.cached = model.prefill_reusing(prompt)  # the browser engine reuses its cache alike
        self.step = lambda token: model.prefill([token])


TVM_CONVERSATIONS = 4  # sequences the tvm engine keeps cached (sharing one context window's KV memory)


class TvmEngine:
    """The artifact's CPU library: one sequence at a time. Its KV cache keeps the last
    TVM_CONVERSATIONS conversations; a request reuses the one it shares the longest prefix with."""

    name = "tvm"
    peak_batch = 1

    def __init__(self, art: Artifact):
        self.library = art.library("cpu").name
        self.model = art.cpu_model(conversations=TVM_CONVERSATIONS)
        self.lock = threading.Lock()

    def describe(self) -> str:
        return f"tvm ({self.library}, one sequence at a time, {TVM_CONVERSATIONS} conversations cached)"

    @contextlib.contextmanager
    def open(self, prompt: list[int], stop: Stop | None = None) -> Iterator[TvmSession]:
        """Wait for the model (Stopped if the request must end first), prefill, yield the session."""
        stop = stop or Stop()
        stop.acquire(self.lock)
        try:
            if reason := stop.check():
                raise Stopped(reason)
            yield TvmSession(self.model, prompt)
        finally:
            self.lock.release()

    def close(self) -> None:
        pass


def choose_engine(art: Artifact, requested: str = "auto") -> tuple[str, str]:
    """(engine, why) for an artifact: ``llamacpp`` when it has a GGUF and llama-cpp-python is
    installed, else ``tvm``; an explicit request that cannot run is an error naming the fix."""
    if requested not in ENGINES:
        raise LanternError(f"unknown engine {requested!r} (choose from {', '.join(ENGINES)})")
    gguf = (art.manifest.get("gguf") or {}).get("files")
    if requested == "tvm":
        return "tvm", "asked for"
    if not gguf:
        if requested == "llamacpp":
            raise LanternError(
                f"artifact {art.path.name} has no GGUF for the llamacpp engine: "
                "rebuild it with the gguf target (lantern build --targets webgpu,cpu,gguf)"
            )
        return "tvm", "the artifact has no GGUF"
    if not llamacpp.available():
        if requested == "llamacpp":
            raise LanternError(f"the llamacpp engine needs llama-cpp-python: {llamacpp.INSTALL_HINT}")
        return "tvm", f"llama-cpp-python is not installed ({llamacpp.INSTALL_HINT})"
    return "llamacpp", "asked for" if requested == "llamacpp" else "the artifact has a GGUF"


class Generator:
    """One artifact served: its template, tokenizer, sampler and grammars over the engine ``engine`` picks
    (choose_engine: auto, llamacpp or tvm), which ``engine`` holds once made (``engine_name`` names it)."""

    def __init__(self, path: Path, engine: str = "auto", *, slots: int = 8, threads: int | None = None):
        self.art = Artifact.open(path)
        self.name = path.name
        self.created = int(path.joinpath("lantern.json").stat().st_mtime)
        self.engine_name, self.engine_reason = choose_engine(self.art, engine)
        model = self.art.manifest["model"]
        self.engine: llamacpp.LlamaCppEngine | TvmEngine
        if self.engine_name == "llamacpp":
            gguf = self.art.manifest["gguf"]
            # llama.cpp ignores some architectures' sliding windows: their GGUF is exact up to the window
            self.context_window = gguf.get("context_window", model["context_window"])
            self.engine = llamacpp.LlamaCppEngine(
                self.art.path / gguf["files"][0],
                vocab_size=model["vocab_size"],
                context_window=self.context_window,
                slots=slots,
                threads=threads,
                kv_overrides=gguf.get("kv_overrides"),
                draft=self.art.path / draft["files"][0] if (draft := self.art.manifest.get("draft")) else None,
            )
            self.context_window = self.engine.context_window  # one slot's KV stream may hold less
        else:
            self.context_window = self.art.context_window("cpu")
            self.engine = TvmEngine(self.art)
        self.prompts = self.art.prompt_tokens()
        self.tokenizer = self.prompts.tokenizer
        self.template = self.art.tokenizer_config().get("chat_template")
        self.bos, self.eos = self.prompts.bos, self.prompts.eos
        chat = json.loads((path / "mlc-chat-config.json").read_text())
        self.stop_ids = request_rules.stop_token_ids(chat)
        self.vocab_size = self.art.manifest["model"]["vocab_size"]
        self.reasoning_tags = self.art.manifest["model"].get("reasoning_tags")  # None: not a reasoning model
        self.generation = self.art.manifest.get("generation") or {}  # sampling defaults of the artifact
        self.token_postproc = (chat.get("tokenizer_info") or {}).get("token_postproc_method", "raw")
        self._grammars: GrammarCompiler | None = None
        self._closer: Closer | None = None
        self._grammars_lock = threading.Lock()

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None, kwargs: dict | None = None) -> str:
        """The prompt text; tools go through the template when it knows them, else Lantern's format.
        ``kwargs``: more template variables (reasoning.template_kwargs)."""
        if not self.template:
            raise InvalidRequest(f"model {self.name} has no chat template; use /v1/completions")
        native = tools and request_rules.template_knows_tools(self.template)
        try:
            return render(
                self.template,
                messages if native else tool_messages(messages, tools),
                bos_token=self.bos,
                eos_token=self.eos,
                tools=tools if native else None,
                **(kwargs or {}),
            )
        except LanternError as err:
            raise InvalidRequest(str(err)) from None

    @property
    def grammars(self) -> GrammarCompiler:
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(
                    json.loads((self.art.path / "tokenizer.json").read_text()),
                    self.token_postproc,
                    self.vocab_size,
                    sorted(self.stop_ids),
                )
            return self._grammars

    @property
    def closer(self) -> Closer:
        """The policy that closes a cut JSON answer (closing.py), made on the first one."""
        with self._grammars_lock:
            if self._closer is None:
                tokenizer_json = json.loads((self.art.path / "tokenizer.json").read_text())
                self._closer = Closer.for_tokenizer(self.tokenizer, tokenizer_json, self.vocab_size, sorted(self.stop_ids))
            return self._closer

    def compile_grammar(self, spec: GrammarSpec | None):
        """The compiled grammar for a request (cached per spec), or StructuredOutputError naming the problem."""
        return None if spec is None else self.grammars.compile(spec)

    def encode(self, text: str, raw: bool = False) -> list[int]:
        """``text``'s tokens; ``raw``: a completion's prompt, not a rendered chat (PromptTokens)."""
        return self.prompts.encode(text, raw)

    def sampling(self, req: SamplingFields) -> SamplingParams:
        return sampling_params(req, self.vocab_size, self.generation)

    def _logprob(self, s: Sampled) -> TokenLogprob:
        def entry(i: int, lp: float) -> dict:
            text = self.tokenizer.decode([i], skip_special_tokens=False)
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}

        return TokenLogprob(**entry(s.token, s.logprob), top_logprobs=[TopLogprob(**entry(i, lp)) for i, lp in s.top])

    def generate(
        self,
        prompt: list[int],
        req: SamplingFields,
        stop: Stop,
        on_step: Callable[[Step], None],
        grammar=None,
        hold_from: str | None = None,
    ) -> None:
        """Run one request to a terminal state, reporting text deltas through ``on_step``.

        ``grammar`` (compiled) masks every step's tokens; text from ``hold_from`` on (a tool call's
        opening tag) is not streamed but left for the terminal step. ``stop`` ends it early: before
        it starts (a terminal step without usage), or at its next token (finish "abort" or "timeout").
        """
        params = self.sampling(req)
        if not prompt:
            raise InvalidRequest("the prompt is empty: give at least one token of text")
        room = self.context_window - len(prompt)
        if room < 1:
            raise InvalidRequest(request_rules.message("prompt_too_long", tokens=len(prompt), window=self.context_window))
        max_tokens = min(req.token_limit() or room, room)
        stops = req.stop_list()
        stop_ids = self.stop_ids | set(req.stop_token_ids or [])
        sampler = Sampler(params, prompt)
        mask: Mask | None = self.grammars.matcher(grammar) if grammar is not None else None
        spec: Speculation | None = None
        # a JSON answer cut by max_tokens is closed (closing.py): its last HOLD tokens wait for the end
        closer = self.closer if mask and closes_cut_answers(req, hold_from, params) else None
        held = 0  # with a closer: the text's length before the tokens that may be rewound
        holds = stops + ([hold_from] if hold_from else [])
        with contextlib.ExitStack() as opened:
            try:
                session: contextlib.AbstractContextManager[llamacpp.Session | TvmSession] = self.engine.open(prompt, stop)
                seq = opened.enter_context(session)
            except Stopped as why:  # never started: it waited past its deadline, or its client left
                on_step(Step("", None, Stop.FINISH[why.reason], None, stopped=why.reason, unused=max_tokens))
                return
            logits, cached, started = seq.logits, seq.cached, seq.started
            if isinstance(seq, llamacpp.Session):
                spec = self._speculation(seq, req, prompt, mask)
            prefill_s = time.perf_counter() - started
            ids: list[int] = []
            text, sent, finish, first_at, late = "", 0, None, 0.0, 0
            pending: list[TokenLogprob] = []
            while True:
                if reason := stop.check():
                    finish = Stop.FINISH[reason]
                    break
                s = sampler.sample(logits, mask.allowed() if mask else None)
                first_at = first_at or time.perf_counter()
                if s.token in stop_ids:
                    finish = "stop"
                    break
                ids.append(s.token)
                late += stop.reason == "client_gone"  # its client left while this token was being made
                sampler.accept(s.token)
                if mask:
                    mask.accept(s.token)
                if spec:
                    spec.push(s.token)
                if params.top_logprobs >= 0:
                    pending.append(self._logprob(s))
                decoded = self.tokenizer.decode(ids, skip_special_tokens=False)
                if not decoded.endswith("\ufffd"):  # never emit half a character
                    text = decoded
                hits = [i for i in (text.find(st, max(0, sent - len(st))) for st in stops) if i >= 0]
                if hits:
                    text, finish = text[: min(hits)], "stop"
                    break
                if len(ids) >= max_tokens:
                    finish = "length"
                    found = closer.close(mask, ids, max_tokens) if closer else None
                    if found:
                        kept, path = found
                        ids = ids[:kept] + path
                        text = self.tokenizer.decode(ids, skip_special_tokens=False)
                    break
                safe = len(text) - held_back(text, holds)
                if closer:
                    held = len(text) if len(ids) <= max_tokens - HOLD else held
                    safe = min(safe, held)
                if hold_from and hold_from in text:
                    safe = min(safe, text.index(hold_from))
                if safe > sent:
                    on_step(Step(text[sent:safe], pending or None))
                    sent, pending = safe, []
                try:
                    logits = spec.next_logits(s.token, max_tokens - len(ids)) if spec else seq.step(s.token)
                except Stopped:
                    continue  # the check at the top of the loop ends it
        decode_s = time.perf_counter() - first_at if first_at else 0.0
        n = len(ids)
        usage = Usage(
            prompt_tokens=len(prompt),
            completion_tokens=n,
            total_tokens=len(prompt) + n,
            ttft_ms=(first_at - started) * 1000 if first_at else 0.0,
            prefill_tokens_per_s=len(prompt) / prefill_s if prefill_s else 0.0,
            decode_tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s else 0.0,
            tpot_ms=decode_s * 1000 / (n - 1) if n > 1 else 0.0,
            cached_prompt_tokens=cached,
            speculation=SpeculationUsage(**spec.usage()) if spec else None,
        )
        stopped = stop.reason if finish in ("abort", "timeout") else None  # not one that ended on its own
        on_step(
            Step(text[sent:], pending or None, finish, usage, stopped=stopped, unused=max_tokens - n if stopped else 0, late=late)
        )

    def speculation_ignored(self, req: SamplingFields) -> str | None:
        """The warning for a request that asks for speculation (its ``speculation`` field, mode not off)
        where this engine makes none of the guesses it asks for; None where it does, or did not ask.
        The twin of speculationIgnored in webruntime/src/engine.ts."""
        if not req.sent("speculation") or req.speculation.mode == "off":
            return None
        if not isinstance(self.engine, llamacpp.LlamaCppEngine):
            why = "the tvm engine does not speculate yet (the llamacpp engine does)"
        elif not self.engine.rows_exact:
            why = llamacpp.SPECULATION_OFF
        elif req.speculation.mode == "draft" and self.engine.draft is None:
            why = "the artifact has no draft model (lantern build --draft)"
        else:
            return None
        return request_rules.message("speculation_ignored", why=why)

    def _speculation(
        self, session: llamacpp.Session, req: SamplingFields, prompt: list[int], mask: Mask | None
    ) -> Speculation | None:
        """The request's speculation (speculation.py): grammar drafts from ``mask``'s forced text, lookup
        drafts from the prompt and the answer. None where the request turns it off, or where this
        llama.cpp build would not check drafts exactly (LlamaCppEngine.describe says why)."""

        def forced(last: int) -> list[int]:
            assert mask is not None
            return forced_drafts(self.tokenizer, mask.forced_text(), self.tokenizer.decode([last], skip_special_tokens=False))

        assert isinstance(self.engine, llamacpp.LlamaCppEngine)
        if req.speculation.mode == "off" or not self.engine.rows_exact:
            return None
        return Speculation(
            session,
            req.speculation.mode,
            req.speculation.max_tokens,
            self.engine.pass_costs,
            prompt,
            forced if mask else None,
            self.engine.draft_cost,
        )

    def describe(self) -> str:
        return f"engine {self.engine.describe()}: {self.engine_reason}; structured output on {build_description()}"

    def close(self) -> None:
        self.engine.close()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"
