"""Run a `lantern serve` app on a free loopback port in a background thread (tests, validate)."""

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
