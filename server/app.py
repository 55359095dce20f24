"""The `lantern serve` application: an OpenAI-compatible API over artifacts (engine.py), plus
the site, the browser runtime and the artifacts as static files (static.py).

This module assembles the app (create_app) and runs its lifespan; the parts live beside it: config
(settings), errors (OpenAI-shaped errors and their handlers), slots (one per model), admission (the
queue in front of each model), streaming (JSON and SSE answers, the ASGI guard), chat (the chat turn)
and routes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from .admission import Server
from .config import Limits, ServerConfig
from .errors import ERROR_HANDLERS
from .routes import router
from .static import SITE, mount_static
from .streaming import ApiGuard

# the names `lantern serve`, lantern validate and the tests import from here
__all__ = ["Limits", "ServerConfig", "create_app", "lifespan"]


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
        if slot.loaded:
            slot.loaded.close()


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
