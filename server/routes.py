"""The FastAPI routes: /health, /metrics, /v1/models, /v1/chat/completions, /v1/completions and
/v1/embeddings. Each generation route picks and checks its model (admission.Server.slot_for), builds the
prompt (and for a chat, the grammar of its response format or tools), and answers through
streaming.respond; /v1/embeddings waits for its vectors (embeddings.Embedder) and answers them whole."""

from __future__ import annotations

import asyncio
import base64
import threading
import time

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from .. import request_rules
from . import reasoning
from .admission import Server
from .chat import ChatTurn
from .engine import InvalidRequest, Step, new_id
from .errors import ApiError
from .protocol import (
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    ModelCard,
    ModelList,
    NamedToolChoice,
)
from .streaming import respond
from .structured import TOOL_OPEN, calls_tools, request_spec

router = APIRouter()


def _server(request: Request) -> Server:
    return request.app.state.lantern


@router.get("/health")
def health(request: Request) -> dict:
    slots = _server(request).slots
    # ready once the slot says so: its engine exists a moment before the load has finished (the grammar
    # engine is found, maybe fetched, as the load describes the model)
    states = {
        n: ("failed" if s.load_error else "ready" if s.ready.is_set() and s.loaded else "loading") for n, s in slots.items()
    }
    return {
        "status": "ok" if all(v == "ready" for v in states.values()) else "loading",
        "models": states,
        "engines": {n: s.loaded.engine_name for n, s in slots.items() if s.loaded},
    }


@router.get("/metrics", response_class=PlainTextResponse)
def metrics_text(request: Request) -> str:
    server = _server(request)
    return server.metrics.render(
        {n: s.waiting for n, s in server.slots.items()},
        {n: s.loaded.engine.peak_batch for n, s in server.slots.items() if s.loaded},
    )


@router.get("/v1/models")
def list_models(request: Request) -> ModelList:
    return ModelList(
        data=[
            ModelCard(id=n, created=int(p.joinpath("lantern.json").stat().st_mtime)) for n, p in _server(request).folders.items()
        ]
    )


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    server = _server(request)
    slot = server.slot_for(req)
    assert slot.generator is not None  # slot_for admits only a loaded model
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
        kwargs = reasoning.template_kwargs(req.chat_template_kwargs, slot.generator.reasoning_tags, strict)
    except ValueError as err:
        raise ApiError(400, str(err), param="chat_template_kwargs") from None
    prompt_text = slot.generator.render_chat(messages, tools if calling else None, kwargs)
    prompt = server.prepare(slot, prompt_text, req)
    grammar = await asyncio.to_thread(slot.generator.compile_grammar, spec) if spec else None
    ignored = slot.generator.speculation_ignored(req)
    warnings = (*(spec.warnings if spec else ()), *([ignored] if ignored else []))
    turn = ChatTurn(slot, req, prompt_text, calling, strict, warnings)
    return await respond(
        server, request, req, slot, prompt, turn.chunk, turn.final, grammar=grammar, hold_from=TOOL_OPEN if calling else None
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

    return await respond(server, request, req, slot, prompt, make_chunk, make_final)


@router.post("/v1/embeddings")
async def embeddings(req: EmbeddingRequest, request: Request) -> EmbeddingList:
    server = _server(request)
    slot = server.slot_for(req, kind="embedding")
    embedder = slot.embedder
    assert embedder is not None  # slot_for admits only a loaded embedding model
    try:
        embedder.check_dimensions(req.dimensions)  # refused before the texts are tokenized
    except InvalidRequest as err:
        raise ApiError(400, str(err), param="dimensions") from None
    try:
        texts = await asyncio.to_thread(embedder.tokens, req.inputs(), req.truncate)
    except InvalidRequest as err:
        raise ApiError(400, str(err), param="input") from None
    server.admit(slot)
    cancelled = threading.Event()  # the client went away or the server stops: drop texts not yet embedded
    try:
        vectors = await asyncio.get_running_loop().run_in_executor(
            slot.executor, embedder.embed, texts, req.dimensions, cancelled
        )
    except asyncio.CancelledError:
        cancelled.set()
        raise
    finally:
        server.release(slot)
    data = [
        Embedding(
            index=i,
            embedding=base64.b64encode(v.astype("<f4").tobytes()).decode() if req.encoding_format == "base64" else v.tolist(),
        )
        for i, v in enumerate(vectors)
    ]
    used = sum(len(t) for t in texts)
    return EmbeddingList(data=data, model=slot.name, usage=EmbeddingUsage(prompt_tokens=used, total_tokens=used))
