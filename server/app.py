"""The `lantern serve` application: an OpenAI-compatible API over artifacts (engine.py), plus
the site, the browser runtime and the artifacts as static files (static.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import request_rules
from . import reasoning
from .engine import InvalidRequest, ModelEngine, Step, Stop, new_id
from .metrics import Metrics
from .protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ErrorBody,
    ErrorResponse,
    FinishReason,
    Logprobs,
    ModelCard,
    ModelList,
    NamedToolChoice,
    SamplingFields,
    ToolCall,
    ToolCallDelta,
)
from .static import SITE, model_folders, mount_static
from .structured import TOOL_OPEN, GrammarCompileFault, StructuredOutputError, calls_tools, parse_tool_calls, request_spec


@dataclass
class Limits:
    max_body_bytes: int = 1 << 20
    max_tokens: int = 4096
    max_queue: int = 16  # requests waiting per model before 429
    request_timeout_s: float | None = None  # a request's deadline unless it sends `timeout` (None: none)
    body_timeout_s: float = 30.0  # a /v1/ request's body must arrive whole within this (else 408)


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
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        self.status, self.body = status, ErrorBody(message=message, type=type_, param=param, code=code)
        self.headers = headers


def _error(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=body).model_dump(), status_code=status, headers=headers)


# nginx's "client closed request": the status counted for a request whose client left before its answer
CLIENT_GONE = 499


class ModelSlot:
    """One model: its engine (loaded in the background) and the queue in front of it."""

    def __init__(self, name: str, path: Path, config: "ServerConfig"):
        self.name, self.path, self.log = name, path, config.log or (lambda line: None)
        self.config = config
        self.engine: ModelEngine | None = None
        self.load_error: str | None = None
        self.waiting = 0
        self.finished: deque[float] = deque(maxlen=256)  # when recent requests ended (Retry-After)
        self.ready = threading.Event()
        # one thread per admitted request: the llamacpp engine decodes them together
        self.executor = ThreadPoolExecutor(max_workers=config.limits.max_queue, thread_name_prefix=f"gen-{name}")

    def load(self) -> None:
        started = time.monotonic()
        self.log(f"loading {self.name} (checking hashes, weights)")
        try:
            self.engine = ModelEngine(self.path, self.config.engine, slots=self.config.parallel, threads=self.config.threads)
            self.log(f"{self.name}: {self.engine.describe()}")
            self.log(f"{self.name} ready in {time.monotonic() - started:.1f} s")
        except Exception as err:  # noqa: BLE001 (reported on every request for this model)
            self.load_error = f"{type(err).__name__}: {err}"
            self.log(f"{self.name} failed to load: {self.load_error}")
        self.ready.set()


class Server:
    """What the routes share: the configuration, one ModelSlot per served artifact, the metrics, and
    the steps every generation takes (pick the model, admit to its queue, run, respond)."""

    def __init__(self, config: ServerConfig):
        self.config, self.limits = config, config.limits
        self.folders = model_folders(config.model_dirs)
        self.slots = {name: ModelSlot(name, path, config) for name, path in self.folders.items()} if config.api else {}
        self.metrics = Metrics()
        self.active: set[Stop] = set()  # the Stop of every admitted request not yet answered
        self.draining = False  # set on SIGTERM: no new requests; lifespan's end stops what still runs
        self.in_flight = 0  # /v1/ requests inside ApiGuard

    def drain(self) -> None:
        self.draining = True

    def slot_for(self, req: SamplingFields) -> ModelSlot:
        slots = self.slots
        name = req.model or (next(iter(slots)) if len(slots) == 1 else None)
        if name is None:
            raise ApiError(400, "several models are served: name one in `model`", param="model")
        if name not in slots:
            raise ApiError(
                404,
                f"the model {name!r} does not exist (served: {', '.join(slots)})",
                type_="not_found_error",
                param="model",
                code="model_not_found",
            )
        slot = slots[name]
        if not slot.ready.is_set():
            raise ApiError(503, f"model {name} is still loading", type_="server_error", code="model_loading")
        if slot.load_error:
            raise ApiError(503, f"model {name} failed to load: {slot.load_error}", type_="server_error")
        if (req.token_limit() or 0) > self.limits.max_tokens:
            raise ApiError(400, f"max_tokens is limited to {self.limits.max_tokens}", param="max_tokens")
        self.check_room(slot)  # before the template, tokenizer and grammar work: a full queue costs nothing
        return slot

    def check_room(self, slot: ModelSlot) -> None:
        """503 while shutting down; 429 with a Retry-After when the model's queue is full."""
        if self.draining:
            raise ApiError(503, "the server is shutting down", type_="server_error", code="shutting_down")
        if slot.waiting >= self.limits.max_queue:
            wait = self.retry_after(slot)
            raise ApiError(
                429,
                f"{slot.waiting} requests are already waiting for {slot.name}; retry in {wait} s",
                type_="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(wait)},
            )

    def admit(self, slot: ModelSlot) -> None:
        """Take a place in the model's queue (checked again: others may have taken the last one)."""
        self.check_room(slot)
        slot.waiting += 1

    @staticmethod
    def retry_after(slot: ModelSlot) -> int:
        """Seconds until a place in a full queue is likely to free: one request's share of the last
        minute's throughput (5 before two requests have finished), from 1 to 60."""
        now = time.monotonic()
        recent = [t for t in slot.finished if now - t <= 60]
        if len(recent) < 2:
            return 5
        per_second = len(recent) / max(now - recent[0], 1.0)
        return max(1, min(60, math.ceil(1 / per_second)))

    async def run(self, slot: ModelSlot, prompt: list[int], req: SamplingFields, on_step, stop: Stop, **constraint):
        """Generate on a worker thread for an admitted request. A task cancelled meanwhile (the
        graceful shutdown's time is up) stops its generation at the next step."""
        assert slot.engine is not None  # slot_for admits only a loaded model

        def step(s: Step) -> None:
            if s.finish is not None:  # the terminal step, also for a client that has gone away
                self.metrics.observe(s)
            on_step(s)

        try:
            await asyncio.get_running_loop().run_in_executor(
                slot.executor, functools.partial(slot.engine.generate, prompt, req, stop, step, **constraint)
            )
        except InvalidRequest as err:
            raise ApiError(400, str(err)) from None
        except asyncio.CancelledError:
            stop.cancel("shutdown")
            raise
        finally:
            slot.waiting -= 1
            slot.finished.append(time.monotonic())

    @staticmethod
    def prepare(slot: ModelSlot, prompt_text: str, req: SamplingFields, raw: bool = False) -> list[int]:
        """The prompt's tokens (``raw``: a completion's prompt, see ModelEngine.encode)."""
        assert slot.engine is not None  # slot_for admits only a loaded model
        try:
            slot.engine.sampling(req)  # reject bad sampling fields before queueing
        except InvalidRequest as err:
            raise ApiError(400, str(err)) from None
        return slot.engine.encode(prompt_text, raw=raw)

    async def respond(
        self, request: Request, req: SamplingFields, slot: ModelSlot, prompt: list[int], make_chunk, make_final, **constraint
    ):
        """Non-streaming: one JSON body. Streaming: SSE chunks and `data: [DONE]`. Either way the
        generation stops at the next step once the client disconnects or the deadline passes."""
        stop = Stop(req.timeout or self.limits.request_timeout_s)
        self.admit(slot)
        self.active.add(stop)
        if not req.stream:
            steps: list[Step] = []
            watcher = asyncio.create_task(_watch_disconnect(request, stop))
            try:
                await self.run(slot, prompt, req, steps.append, stop, **constraint)
            finally:
                watcher.cancel()
                self.active.discard(stop)
            if steps[-1].stopped == "client_gone":
                return Response(status_code=CLIENT_GONE)  # nobody reads it; counted in /metrics
            if steps[-1].finish == "timeout":
                raise _timed_out(stop, steps[-1])
            return make_final(steps)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        async def produce():
            try:
                await self.run(slot, prompt, req, lambda s: loop.call_soon_threadsafe(queue.put_nowait, s), stop, **constraint)
                loop.call_soon_threadsafe(queue.put_nowait, None)
            except ApiError as err:
                queue.put_nowait(err)
            except Exception as err:  # noqa: BLE001 (the stream has started: report in-band, never hang the client)
                queue.put_nowait(ApiError(500, f"generation failed: {type(err).__name__}: {err}", "server_error"))

        producer = asyncio.create_task(produce())
        include_usage = req.stream_options.include_usage

        complete = False

        async def events():
            nonlocal complete
            first = True
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, ApiError):
                    yield _sse_error(item.body)
                    break
                if item.finish == "timeout":  # the text so far and finish_reason "timeout", then the error
                    queue.put_nowait(_timed_out(stop, item))
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
            complete = True

        def closed() -> bool:
            """Stop the generation (a client that went away: at the next step); True if the shutdown cut it."""
            stop.cancel("shutdown" if self.draining else "client_gone")
            self.active.discard(stop)
            return self.draining and not complete

        response = _Stream(
            events(), closed, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        response.producer = producer  # keep a reference: the task must not be collected mid-run
        return response


class _Stream(StreamingResponse):
    """A StreamingResponse that calls ``closed()`` when it ends in any way: finished, its client gone
    (even before the first event), or its task cancelled; a stream the shutdown cut ends with the reason."""

    producer: asyncio.Task[None]  # the generation feeding it (Server.respond keeps the reference here)

    def __init__(self, content, closed: Callable[[], bool], **kwargs):
        super().__init__(content, **kwargs)
        self.closed = closed

    async def __call__(self, scope, receive, send) -> None:
        cut = False
        try:
            await super().__call__(scope, receive, send)
        finally:
            cut = self.closed()
        if cut:  # Starlette ends a cancelled stream quietly (its task group takes the cancellation)
            await ApiGuard.shut_down(200, send)


def _server(request: Request) -> Server:
    return request.app.state.lantern


async def _watch_disconnect(request: Request, stop: Stop) -> None:
    """Cancel ``stop`` when the client of a non-streaming request disconnects (its body is read, so
    the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    stop.cancel("client_gone")


def _sse_error(body: ErrorBody) -> str:
    """An error as a stream's event (OpenAI's shape): the stream's last before `data: [DONE]`, or its end."""
    return f"data: {json.dumps(ErrorResponse(error=body).model_dump())}\n\n"


def _timed_out(stop: Stop, last: Step) -> ApiError:
    made = last.usage.completion_tokens if last.usage else 0
    where = f"after {made} tokens" if last.usage else "before it started (it waited in the queue)"
    return ApiError(
        504,
        f"the request reached its timeout of {stop.timeout_s:g} s {where}",
        type_="server_error",
        param="timeout",
        code="timeout",
    )


# --------------------------------------------------------------------------- middleware and errors


class ApiGuard:
    """An ASGI middleware for /v1/: the API key; the body, read whole before the route runs, within
    Limits.max_body_bytes (413) and Limits.body_timeout_s (408: a client that sends its body slowly
    cannot hold a connection); and a count of every response by status. Other paths pass untouched."""

    def __init__(self, app, server: Server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        status = 0
        self.server.in_flight += 1

        async def counted(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refusal = self.refusal(dict(scope["headers"]))
            body: bytes | None = b""
            if refusal is None:
                body, refusal = await self.read_body(receive)
            if refusal is not None:
                await refusal(scope, receive, counted)
            elif body is not None:
                await self.app(scope, _replay(body, receive), counted)
        except Exception:
            status = status or 500  # answered by Starlette's outermost error handler
            raise
        except asyncio.CancelledError:
            if not self.server.draining:
                raise
            await self.shut_down(status, counted)  # uvicorn's graceful shutdown is over: end it with a reason
        finally:
            self.server.in_flight -= 1
            self.server.metrics.count_request(scope["path"], status or CLIENT_GONE)

    @staticmethod
    async def shut_down(status: int, send) -> None:
        """End a request that the shutdown cancelled: a 503, or a stream's error event and its end
        (without `data: [DONE]`, so no client takes it for a whole answer)."""
        body = ErrorBody(
            message="the server shut down before the answer was complete (--shutdown-timeout)",
            type="server_error",
            code="shutting_down",
        )
        with contextlib.suppress(Exception):
            if not status:
                await _error(503, body)({"type": "http"}, None, send)  # type: ignore[arg-type]  # a Response never receives
            else:
                await send({"type": "http.response.body", "body": _sse_error(body).encode(), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    def refusal(self, headers: dict[bytes, bytes]) -> JSONResponse | None:
        key, limit = self.server.config.api_key, self.server.limits.max_body_bytes
        if key and headers.get(b"authorization") != f"Bearer {key}".encode():
            return _error(
                401,
                ErrorBody(
                    message="missing or wrong API key (Authorization: Bearer ...)",
                    type="authentication_error",
                    code="invalid_api_key",
                ),
            )
        size = headers.get(b"content-length", b"")
        if size.isdigit() and int(size) > limit:
            return self.too_large(limit)
        return None

    @staticmethod
    def too_large(limit: int) -> JSONResponse:
        return _error(
            413, ErrorBody(message=f"request body over {limit} bytes", type="invalid_request_error", code="request_too_large")
        )

    async def read_body(self, receive) -> tuple[bytes | None, JSONResponse | None]:
        """(body, None), (None, a refusal), or (None, None) when the client left before sending it."""
        limits, parts, size = self.server.limits, [], 0
        try:
            async with asyncio.timeout(limits.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None, None
                    parts.append(message.get("body", b""))
                    size += len(parts[-1])
                    if size > limits.max_body_bytes:  # a chunked body has no content-length to check first
                        return None, self.too_large(limits.max_body_bytes)
                    if not message.get("more_body"):
                        return b"".join(parts), None
        except TimeoutError:
            return None, _error(
                408,
                ErrorBody(
                    message=f"the request body did not arrive within {limits.body_timeout_s:g} s ({size} bytes came)",
                    type="invalid_request_error",
                    code="request_timeout",
                ),
            )


def _replay(body: bytes, receive):
    """An ASGI receive that gives the body read already, then the client's own messages (its disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def api_error(_: Request, err: ApiError):
    return _error(err.status, err.body, err.headers)


async def internal_error(_: Request, err: Exception):
    return _error(500, ErrorBody(message=f"{type(err).__name__}: {err}", type="server_error"))


async def compile_fault(_: Request, err: Exception):
    return _error(503, ErrorBody(message=str(err), type="server_error", code="grammar_compile_timeout"), {"Retry-After": "1"})


async def invalid_request(_: Request, err: Exception):
    return _error(400, ErrorBody(message=str(err), type="invalid_request_error"))


async def validation_error(_: Request, err: RequestValidationError):
    first = err.errors()[0] if err.errors() else {}
    if first.get("type") == "request_rule":  # request_rules.json's message, as the browser words it
        return _error(400, ErrorBody(message=first["msg"], type="invalid_request_error", param=first["ctx"]["param"]))
    loc = ".".join(str(x) for x in first.get("loc", ())[1:])
    return _error(
        400,
        ErrorBody(
            message=f"{loc or 'body'}: {first.get('msg', 'invalid request')}", type="invalid_request_error", param=loc or None
        ),
    )


async def http_error(_: Request, err: StarletteHTTPException):
    kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
    return _error(err.status_code, ErrorBody(message=str(err.detail), type=kind))


# each handler takes the kind it is registered for (Starlette's handler type takes any Exception)
ERROR_HANDLERS: tuple[tuple[type[Exception], Callable[[Request, Any], Awaitable[JSONResponse]]], ...] = (
    (ApiError, api_error),
    (Exception, internal_error),
    (InvalidRequest, invalid_request),
    (StructuredOutputError, invalid_request),
    (GrammarCompileFault, compile_fault),
    (RequestValidationError, validation_error),
    (StarletteHTTPException, http_error),
)


# --------------------------------------------------------------------------- routes

router = APIRouter()


@router.get("/health")
def health(request: Request) -> dict:
    slots = _server(request).slots
    states = {n: ("failed" if s.load_error else "ready" if s.engine else "loading") for n, s in slots.items()}
    return {
        "status": "ok" if all(v == "ready" for v in states.values()) else "loading",
        "models": states,
        "engines": {n: s.engine.engine for n, s in slots.items() if s.engine},
    }


@router.get("/metrics", response_class=PlainTextResponse)
def metrics_text(request: Request) -> str:
    server = _server(request)
    return server.metrics.render(
        {n: s.waiting for n, s in server.slots.items()},
        {n: s.engine.decoder.peak_batch for n, s in server.slots.items() if s.engine},
    )


@router.get("/v1/models")
def list_models(request: Request) -> ModelList:
    return ModelList(
        data=[
            ModelCard(id=n, created=int(p.joinpath("lantern.json").stat().st_mtime)) for n, p in _server(request).folders.items()
        ]
    )


class ChatTurn:
    """One chat completion's answer, streamed or whole: the reasoning split off, tool calls parsed from
    the whole text (they arrive whole in the last chunk)."""

    def __init__(
        self,
        slot: ModelSlot,
        req: ChatCompletionRequest,
        prompt_text: str,
        calling: bool,
        strict: bool,
        warnings: tuple[str, ...] = (),
    ):
        self.slot, self.calling, self.logprobs_on = slot, calling, req.logprobs
        # what the schema's rewrite ignored (unknown keywords, ...): on the answer, the first chunk of a stream
        self.extra: dict[str, Any] = {"lantern_warnings": list(warnings)} if warnings else {}
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self.streamed: list[str] = []  # content so far, for the tool calls in the last chunk
        assert slot.engine is not None  # slot_for admits only a loaded model
        tags = slot.engine.reasoning_tags
        self.splitter = (
            reasoning.ReasoningSplitter(tags, reasoning.opens_in_prompt(prompt_text, tags)) if tags and not strict else None
        )

    def split(self, step: Step) -> tuple[str | None, str]:
        """(reasoning, content) deltas of a step's text."""
        if self.splitter is None:
            return None, step.delta
        r, c = self.splitter.push(step.delta)
        if step.finish is not None:
            r2, c2 = self.splitter.finish()
            r, c = r + r2, c + c2
        return r, c

    def split_calls(self, text: str) -> tuple[str | None, list[ToolCall] | None, FinishReason | None]:
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
                delta.content = (content or "")[len(sent) :] if (content or "").startswith(sent) else ""
                delta.tool_calls = [ToolCallDelta(index=i, **c.model_dump()) for i, c in enumerate(calls)]
                finish = calls_finish
        # lantern_route: an extra field (extra="allow"), as the browser's router adds it (router.ts)
        return ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.slot.name,  # type: ignore[call-arg]
            usage=step.usage,
            choices=[
                ChunkChoice(
                    delta=delta,
                    finish_reason=finish,
                    logprobs=Logprobs(content=step.logprobs) if self.logprobs_on and step.logprobs else None,
                )
            ],
            lantern_route="cloud",
            **(self.extra if first else {}),
        )

    def final(self, steps: list[Step]) -> ChatCompletion:
        lps = [lp for s in steps for lp in (s.logprobs or [])]
        parts = [self.split(s) for s in steps]
        thought = "".join(r or "" for r, _ in parts) if self.splitter else None
        content, calls, finish = self.split_calls("".join(c for _, c in parts))
        last = steps[-1]
        assert last.usage is not None and last.finish is not None  # the terminal step of a request that ran
        # lantern_route: an extra field (extra="allow"), as the browser's router adds it (router.ts)
        return ChatCompletion(  # type: ignore[call-arg]
            id=self.id,
            created=self.created,
            model=self.slot.name,
            usage=last.usage,
            lantern_route="cloud",
            **self.extra,
            choices=[
                Choice(
                    message=AssistantMessage(content=content, reasoning_content=thought, tool_calls=calls),
                    finish_reason=finish or last.finish,
                    logprobs=Logprobs(content=lps) if self.logprobs_on else None,
                )
            ],
        )


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    server = _server(request)
    slot = server.slot_for(req)
    assert slot.engine is not None  # slot_for admits only a loaded model
    messages = request_rules.template_messages([m.model_dump(exclude_none=True) for m in req.messages])
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedToolChoice) else req.tool_choice
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
    turn = ChatTurn(slot, req, prompt_text, calling, strict, spec.warnings if spec else ())
    return await server.respond(
        request, req, slot, prompt, turn.chunk, turn.final, grammar=grammar, hold_from=TOOL_OPEN if calling else None
    )


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request):
    server = _server(request)
    slot = server.slot_for(req)
    prompt = server.prepare(slot, req.prompt, req, raw=True)
    cid, created = new_id("cmpl"), int(time.time())

    def make_chunk(step: Step, first: bool) -> Completion:
        text = (req.prompt if first and req.echo else "") + step.delta
        return Completion(
            id=cid,
            created=created,
            model=slot.name,
            usage=step.usage,
            choices=[CompletionChoice(text=text, finish_reason=step.finish)],
        )

    def make_final(steps: list[Step]) -> Completion:
        text = (req.prompt if req.echo else "") + "".join(s.delta for s in steps)
        return Completion(
            id=cid,
            created=created,
            model=slot.name,
            usage=steps[-1].usage,
            choices=[CompletionChoice(text=text, finish_reason=steps[-1].finish)],
        )

    return await server.respond(request, req, slot, prompt, make_chunk, make_final)


# --------------------------------------------------------------------------- the app


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    # Models load in the background: /health says "loading" and requests get 503 meanwhile.
    slots = app.state.lantern.slots
    for slot in slots.values():
        threading.Thread(target=slot.load, daemon=True, name=f"load-{slot.name}").start()
    yield
    # uvicorn's graceful shutdown is over (--shutdown-timeout) and it has cancelled the requests left:
    # stop their generations, and let them answer why (503, or a stream's error event) before the exit
    server = app.state.lantern
    for stop in list(server.active):
        stop.cancel("shutdown")
    for _ in range(100):
        if not server.in_flight:
            break
        await asyncio.sleep(0.02)
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
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
        )
    app.add_middleware(ApiGuard, server=server)
    for kind, handler in ERROR_HANDLERS:
        app.add_exception_handler(kind, handler)
    app.include_router(router)
    mount_static(app, server.folders, config.site if config.site is not None else SITE)
    return app
