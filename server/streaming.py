"""Streaming and the ASGI guard: `respond` answers an admitted request, as one JSON body or as
server-sent events ending in `data: [DONE]`, and stops its generation when the client leaves, the
deadline passes or the shutdown cuts it; `ApiGuard` is the middleware in front of /v1/ (the API key,
the body read whole within its size and time limits, a count of every response by status, and the
reason a request the shutdown cancelled ends with)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .admission import Server
from .engine import Step, Stop
from .errors import ApiError, error_response
from .protocol import ErrorBody, ErrorResponse, SamplingFields
from .slots import ModelSlot


# nginx's "client closed request": the status counted for a request whose client left before its answer
CLIENT_GONE = 499


async def respond(
    server: Server,
    request: Request,
    req: SamplingFields,
    slot: ModelSlot,
    prompt: list[int],
    make_chunk,
    make_final,
    **constraint,
):
    """Non-streaming: one JSON body. Streaming: SSE chunks and `data: [DONE]`. Either way the
    generation stops at the next step once the client disconnects or the deadline passes."""
    stop = Stop(req.timeout or server.limits.request_timeout_s)
    server.admit(slot)
    server.active.add(stop)
    if not req.stream:
        steps: list[Step] = []
        watcher = asyncio.create_task(_watch_disconnect(request, stop))
        try:
            await server.run(slot, prompt, req, steps.append, stop, **constraint)
        finally:
            watcher.cancel()
            server.active.discard(stop)
        if steps[-1].stopped == "client_gone":
            return Response(status_code=CLIENT_GONE)  # nobody reads it; counted in /metrics
        if steps[-1].finish == "timeout":
            raise _timed_out(stop, steps[-1])
        return make_final(steps)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def produce():
        try:
            await server.run(slot, prompt, req, lambda s: loop.call_soon_threadsafe(queue.put_nowait, s), stop, **constraint)
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
        stop.cancel("shutdown" if server.draining else "client_gone")
        server.active.discard(stop)
        return server.draining and not complete

    response = _Stream(
        events(), closed, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    response.producer = producer  # keep a reference: the task must not be collected mid-run
    return response


class _Stream(StreamingResponse):
    """A StreamingResponse that calls ``closed()`` when it ends in any way: finished, its client gone
    (even before the first event), or its task cancelled; a stream the shutdown cut ends with the reason."""

    producer: asyncio.Task[None]  # the generation feeding it (respond keeps the reference here)

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
                await error_response(503, body)({"type": "http"}, None, send)  # type: ignore[arg-type]  # a Response never receives
            else:
                await send({"type": "http.response.body", "body": _sse_error(body).encode(), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    def refusal(self, headers: dict[bytes, bytes]) -> JSONResponse | None:
        key, limit = self.server.config.api_key, self.server.limits.max_body_bytes
        if key and headers.get(b"authorization") != f"Bearer {key}".encode():
            return error_response(
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
        return error_response(
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
            return None, error_response(
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
