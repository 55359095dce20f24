"""Run a `lantern serve` app: until a signal (the CLI), or on a free loopback port in a background
thread (tests, validate)."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Iterator

from fastapi import FastAPI


@contextlib.contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Yields the base URL (http://127.0.0.1:PORT) while uvicorn serves ``app``."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def serve_until_signal(app: FastAPI, host: str, port: int, shutdown_timeout: float) -> None:
    """uvicorn until SIGTERM or SIGINT. Then: no new connections, new requests on open ones get 503
    (Server.drain), the running ones get ``shutdown_timeout`` seconds to finish, then uvicorn cancels
    them and the app's lifespan stops their generations at the next step (each thread ends within
    one forward pass, so the process exits right after). A second signal exits at once."""
    import uvicorn

    class Draining(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            app.state.lantern.drain()
            super().handle_exit(sig, frame)

    Draining(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            # annotated int by uvicorn, which waits with asyncio.timeout: a float works
            timeout_graceful_shutdown=shutdown_timeout,  # type: ignore[arg-type]
        )
    ).run()
