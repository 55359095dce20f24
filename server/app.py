"""The `lantern serve` application: an OpenAI-compatible API over artifacts (engine.py), plus
the site, the browser runtime and the artifacts as static files (static.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import request_rules
from . import reasoning
from .engine import InvalidRequest, ModelEngine, Step, new_id
from .metrics import Metrics
from .protocol import (AssistantMessage, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice,
                       ChunkChoice, Completion, CompletionChoice, CompletionRequest, Delta, ErrorBody,
                       ErrorResponse, Logprobs, ModelCard, ModelList, SamplingFields, ToolCall, ToolCallDelta)
from .static import SITE, model_folders, mount_static
from .structured import TOOL_OPEN, StructuredOutputError, calls_tools, parse_tool_calls, request_spec


@dataclass
class Limits:
    max_body_bytes: int = 1 << 20
    max_tokens: int = 4096
    max_queue: int = 16  # requests waiting per model before 429


@dataclass
class ServerConfig:
    model_dirs: list[Path]
    site: Path | None = None
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    api: bool = True  # False: static files only, no models loaded
    engine: str = "auto"  # auto | llamacpp | tvm (engine.choose_engine)
    parallel: int = 8  # llamacpp: sequences decoded together
    threads: int | None = None  # llamacpp: CPU threads (None: all cores)
    log: Callable[[str], None] | None = None  # progress lines (`lantern serve` prints them)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        self.status, self.body = status, ErrorBody(message=message, type=type_, param=param, code=code)


def _error(status: int, body: ErrorBody) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=body).model_dump(), status_code=status)


class ModelSlot:
    """One model: its engine (loaded in the background) and the queue in front of it."""

    def __init__(self, name: str, path: Path, config: "ServerConfig"):
        self.name, self.path, self.log = name, path, config.log or (lambda line: None)
        self.config = config
        self.engine: ModelEngine | None = None
        self.load_error: str | None = None
        self.waiting = 0
        self.ready = threading.Event()
        # one thread per admitted request: the llamacpp engine decodes them together
        self.executor = ThreadPoolExecutor(max_workers=config.limits.max_queue, thread_name_prefix=f"gen-{name}")

    def load(self) -> None:
        started = time.monotonic()
        self.log(f"loading {self.name} (checking hashes, weights)")
        try:
            self.engine = ModelEngine(self.path, self.config.engine, slots=self.config.parallel,
                                      threads=self.config.threads)
            self.log(f"{self.name}: {self.engine.describe()}")
            self.log(f"{self.name} ready in {time.monotonic() - started:.1f} s")
        except Exception as err:  # reported on every request for this model
            self.load_error = f"{type(err).__name__}: {err}"
            self.log(f"{self.name} failed to load: {self.load_error}")
        self.ready.set()


class Server:
    """What the routes share: the configuration, one ModelSlot per served artifact, the metrics, and
    the steps every generation takes (pick the model, admit to its queue, run, respond)."""

    def __init__(self, config: ServerConfig):
        self.config, self.limits = config, config.limits
        self.folders = model_folders(config.model_dirs)
        self.slots = ({name: ModelSlot(name, path, config) for name, path in self.folders.items()}
                      if config.api else {})
        self.metrics = Metrics()

    def slot_for(self, req: SamplingFields) -> ModelSlot:
        slots = self.slots
        name = req.model or (next(iter(slots)) if len(slots) == 1 else None)
        if name is None:
            raise ApiError(400, "several models are served: name one in `model`", param="model")
        if name not in slots:
            raise ApiError(404, f"the model {name!r} does not exist (served: {', '.join(slots)})",
                           type_="not_found_error", param="model", code="model_not_found")
        slot = slots[name]
        if not slot.ready.is_set():
            raise ApiError(503, f"model {name} is still loading", type_="server_error", code="model_loading")
        if slot.load_error:
            raise ApiError(503, f"model {name} failed to load: {slot.load_error}", type_="server_error")
        if (req.token_limit() or 0) > self.limits.max_tokens:
            raise ApiError(400, f"max_tokens is limited to {self.limits.max_tokens}", param="max_tokens")
        return slot

    def admit(self, slot: ModelSlot) -> None:
        """Take a place in the model's queue, or 429 (before any response byte is sent)."""
        if slot.waiting >= self.limits.max_queue:
            raise ApiError(429, f"{slot.waiting} requests are already waiting for {slot.name}; retry later",
                           type_="rate_limit_error", code="queue_full")
        slot.waiting += 1

    async def run(self, slot: ModelSlot, prompt: list[int], req: SamplingFields, on_step,
                  cancelled: threading.Event, **constraint):
        """Generate on a worker thread for an admitted request."""
        def step(s: Step) -> None:
            if s.usage is not None:  # the terminal step, also for a client that has gone away
                self.metrics.observe(s.usage, s.finish)
            on_step(s)

        try:
            await asyncio.get_running_loop().run_in_executor(
                slot.executor, functools.partial(slot.engine.generate, prompt, req, cancelled, step, **constraint))
        except InvalidRequest as err:
            raise ApiError(400, str(err)) from None
        finally:
            slot.waiting -= 1

    @staticmethod
    def prepare(slot: ModelSlot, prompt_text: str, req: SamplingFields) -> list[int]:
        try:
            slot.engine.sampling(req)  # reject bad sampling fields before queueing
        except InvalidRequest as err:
            raise ApiError(400, str(err)) from None
        return slot.engine.encode(prompt_text)

    async def respond(self, req: SamplingFields, slot: ModelSlot, prompt: list[int], make_chunk, make_final,
                      **constraint):
        """Non-streaming: one JSON body. Streaming: SSE chunks and `data: [DONE]`."""
        cancelled = threading.Event()
        self.admit(slot)
        if not req.stream:
            steps: list[Step] = []
            try:
                await self.run(slot, prompt, req, steps.append, cancelled, **constraint)
            finally:
                cancelled.set()
            return make_final(steps)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        async def produce():
            try:
                await self.run(slot, prompt, req, lambda s: loop.call_soon_threadsafe(queue.put_nowait, s),
                               cancelled, **constraint)
                loop.call_soon_threadsafe(queue.put_nowait, None)
            except ApiError as err:
                queue.put_nowait(err)
            except Exception as err:  # the stream has started: report in-band, never hang the client
                queue.put_nowait(ApiError(500, f"generation failed: {type(err).__name__}: {err}", "server_error"))

        producer = asyncio.create_task(produce())
        include_usage = req.stream_options.include_usage

        async def events():
            first = True
            try:
                while True:
                    item = await queue.get()
                    if item is None:
                        break
                    if isinstance(item, ApiError):
                        yield f"data: {json.dumps(ErrorResponse(error=item.body).model_dump())}\n\n"
                        break
                    chunk = make_chunk(item, first)
                    first = False
                    if item.usage is not None and not include_usage:
                        chunk.usage = None
                    body = chunk.model_dump()
                    for choice in body["choices"]:  # OpenAI sends `role` only in the first delta
                        delta = choice.get("delta", {})
                        for key in ("role", "reasoning_content"):
                            if key in delta and delta[key] is None:
                                del delta[key]
                    yield f"data: {json.dumps(body)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                cancelled.set()  # a client that went away stops its generation at the next step

        response = StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        response.producer = producer  # keep a reference: the task must not be collected mid-run
        return response


def _server(request: Request) -> Server:
    return request.app.state.lantern


# --------------------------------------------------------------------------- middleware and errors


async def guard(request: Request, call_next):
    """/v1/: the API key and the body size limit; every /v1/ response is counted."""
    server, path = _server(request), request.url.path
    if path.startswith("/v1/"):
        key = server.config.api_key
        if key and request.headers.get("authorization") != f"Bearer {key}":
            return _error(401, ErrorBody(message="missing or wrong API key (Authorization: Bearer ...)",
                                         type="authentication_error", code="invalid_api_key"))
        size, limit = request.headers.get("content-length"), server.limits.max_body_bytes
        if size is not None and size.isdigit() and int(size) > limit:
            return _error(413, ErrorBody(message=f"request body over {limit} bytes",
                                         type="invalid_request_error", code="request_too_large"))
    response = await call_next(request)
    if path.startswith("/v1/"):
        server.metrics.count_request(path, response.status_code)
    return response


async def api_error(_: Request, err: ApiError):
    return _error(err.status, err.body)


async def internal_error(_: Request, err: Exception):
    return _error(500, ErrorBody(message=f"{type(err).__name__}: {err}", type="server_error"))


async def invalid_request(_: Request, err: Exception):
    return _error(400, ErrorBody(message=str(err), type="invalid_request_error"))


async def validation_error(_: Request, err: RequestValidationError):
    first = err.errors()[0] if err.errors() else {}
    if first.get("type") == "request_rule":  # request_rules.json's message, as the browser words it
        return _error(400, ErrorBody(message=first["msg"], type="invalid_request_error",
                                     param=first["ctx"]["param"]))
    loc = ".".join(str(x) for x in first.get("loc", ())[1:])
    return _error(400, ErrorBody(message=f"{loc or 'body'}: {first.get('msg', 'invalid request')}",
                                 type="invalid_request_error", param=loc or None))


async def http_error(_: Request, err: StarletteHTTPException):
    kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
    return _error(err.status_code, ErrorBody(message=str(err.detail), type=kind))


ERROR_HANDLERS = ((ApiError, api_error), (Exception, internal_error), (InvalidRequest, invalid_request),
                  (StructuredOutputError, invalid_request), (RequestValidationError, validation_error),
                  (StarletteHTTPException, http_error))


# --------------------------------------------------------------------------- routes

router = APIRouter()


@router.get("/health")
def health(request: Request) -> dict:
    slots = _server(request).slots
    states = {n: ("failed" if s.load_error else "ready" if s.engine else "loading") for n, s in slots.items()}
    return {"status": "ok" if all(v == "ready" for v in states.values()) else "loading", "models": states,
            "engines": {n: s.engine.engine for n, s in slots.items() if s.engine}}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics_text(request: Request) -> str:
    server = _server(request)
    return server.metrics.render({n: s.waiting for n, s in server.slots.items()},
                                 {n: s.engine.decoder.peak_batch for n, s in server.slots.items() if s.engine})


@router.get("/v1/models")
def list_models(request: Request) -> ModelList:
    return ModelList(data=[ModelCard(id=n, created=int(p.joinpath("lantern.json").stat().st_mtime))
                           for n, p in _server(request).folders.items()])


class ChatTurn:
    """One chat completion's answer, streamed or whole: the reasoning split off, tool calls parsed from
    the whole text (they arrive whole in the last chunk)."""

    def __init__(self, slot: ModelSlot, req: ChatCompletionRequest, prompt_text: str, calling: bool, strict: bool):
        self.slot, self.calling, self.logprobs_on = slot, calling, req.logprobs
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self.streamed: list[str] = []  # content so far, for the tool calls in the last chunk
        tags = slot.engine.reasoning_tags
        self.splitter = (reasoning.ReasoningSplitter(tags, reasoning.opens_in_prompt(prompt_text, tags))
                         if tags and not strict else None)

    def split(self, step: Step) -> tuple[str | None, str]:
        """(reasoning, content) deltas of a step's text."""
        if self.splitter is None:
            return None, step.delta
        r, c = self.splitter.push(step.delta)
        if step.finish is not None:
            r2, c2 = self.splitter.finish()
            r, c = r + r2, c + c2
        return r, c

    def split_calls(self, text: str) -> tuple[str | None, list[ToolCall] | None, str | None]:
        """Content, tool calls and the finish reason override for the whole generated text."""
        if not self.calling:
            return text, None, None
        content, calls = parse_tool_calls(text)
        return content, [ToolCall(**c) for c in calls] or None, "tool_calls" if calls else None

    def chunk(self, step: Step, first: bool) -> ChatCompletionChunk:
        thought, text = self.split(step)
        self.streamed.append(text)
        delta = Delta(role="assistant" if first else None, content=text, reasoning_content=thought or None)
        finish = step.finish
        if self.calling and step.finish is not None:
            content, calls, calls_finish = self.split_calls("".join(self.streamed))
            if calls:
                sent = "".join(self.streamed[:-1])
                delta.content = (content or "")[len(sent):] if (content or "").startswith(sent) else ""
                delta.tool_calls = [ToolCallDelta(index=i, **c.model_dump()) for i, c in enumerate(calls)]
                finish = calls_finish
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.slot.name, usage=step.usage,
                                   choices=[ChunkChoice(delta=delta, finish_reason=finish,
                                                        logprobs=Logprobs(content=step.logprobs)
                                                        if self.logprobs_on and step.logprobs else None)],
                                   lantern_route="cloud")

    def final(self, steps: list[Step]) -> ChatCompletion:
        lps = [lp for s in steps for lp in (s.logprobs or [])]
        parts = [self.split(s) for s in steps]
        thought = "".join(r or "" for r, _ in parts) if self.splitter else None
        content, calls, finish = self.split_calls("".join(c for _, c in parts))
        return ChatCompletion(
            id=self.id, created=self.created, model=self.slot.name, usage=steps[-1].usage, lantern_route="cloud",
            choices=[Choice(message=AssistantMessage(content=content, reasoning_content=thought, tool_calls=calls),
                            finish_reason=finish or steps[-1].finish,
                            logprobs=Logprobs(content=lps) if self.logprobs_on else None)])


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    server = _server(request)
    slot = server.slot_for(req)
    messages = request_rules.template_messages([m.model_dump(exclude_none=True) for m in req.messages])
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else req.tool_choice
    fmt = req.response_format.model_dump(exclude_none=True) if req.response_format else None
    # schema checks and grammar compiles can take a while (a long string: a long automaton): off the event
    # loop; a plain request stays on it (a thread hop would reorder a burst's admissions)
    args = (fmt, tools, choice, req.parallel_tool_calls, req.schema_defaults.model_dump())
    spec = await asyncio.to_thread(request_spec, *args) if fmt or tools else request_spec(*args)
    calling = calls_tools(tools, choice)
    # a grammar that decides every token: no reasoning first (auto tool calls leave free text)
    strict = spec is not None and not (calling and choice in (None, "auto"))
    try:
        kwargs = reasoning.template_kwargs(req.chat_template_kwargs, slot.engine.reasoning_tags, strict)
    except ValueError as err:
        raise ApiError(400, str(err), param="chat_template_kwargs") from None
    prompt_text = slot.engine.render_chat(messages, tools if calling else None, kwargs)
    prompt = server.prepare(slot, prompt_text, req)
    grammar = await asyncio.to_thread(slot.engine.compile_grammar, spec) if spec else None
    turn = ChatTurn(slot, req, prompt_text, calling, strict)
    return await server.respond(req, slot, prompt, turn.chunk, turn.final, grammar=grammar,
                                hold_from=TOOL_OPEN if calling else None)


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request):
    server = _server(request)
    slot = server.slot_for(req)
    prompt = server.prepare(slot, req.prompt, req)
    cid, created = new_id("cmpl"), int(time.time())

    def make_chunk(step: Step, first: bool) -> Completion:
        text = (req.prompt if first and req.echo else "") + step.delta
        return Completion(id=cid, created=created, model=slot.name, usage=step.usage,
                          choices=[CompletionChoice(text=text, finish_reason=step.finish)])

    def make_final(steps: list[Step]) -> Completion:
        text = (req.prompt if req.echo else "") + "".join(s.delta for s in steps)
        return Completion(id=cid, created=created, model=slot.name, usage=steps[-1].usage,
                          choices=[CompletionChoice(text=text, finish_reason=steps[-1].finish)])

    return await server.respond(req, slot, prompt, make_chunk, make_final)


# --------------------------------------------------------------------------- the app


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    # Models load in the background: /health says "loading" and requests get 503 meanwhile.
    slots = app.state.lantern.slots
    for slot in slots.values():
        threading.Thread(target=slot.load, daemon=True, name=f"load-{slot.name}").start()
    yield
    for slot in slots.values():
        slot.executor.shutdown(wait=False, cancel_futures=True)
        if slot.engine:
            slot.engine.close()


def create_app(model_dirs: list[Path] | ServerConfig, site: Path | None = None) -> FastAPI:
    config = model_dirs if isinstance(model_dirs, ServerConfig) else ServerConfig(list(model_dirs), site)
    server = Server(config)
    app = FastAPI(title="Lantern", version="0.1.0", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.lantern = server
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"])
    app.middleware("http")(guard)
    for kind, handler in ERROR_HANDLERS:
        app.add_exception_handler(kind, handler)
    app.include_router(router)
    mount_static(app, server.folders, config.site if config.site is not None else SITE)
    return app
