"""When a request must end before its answer is complete: the generator's and the engines' shared
signal (engine.py, llamacpp.py)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .protocol import FinishReason


class Stopped(Exception):
    """Raised by an engine while a request waits for it, once the request's Stop says so."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Stop:
    """Whether a request must end before its answer is complete, and why: ``client_gone`` (its client
    disconnected), ``timeout`` (its deadline passed, waiting in the queue included) or ``shutdown``.

    The generator checks it before every token; the engines check it while the request waits for a
    slot or for a forward pass (every POLL_S), so a request stops within one step wherever it is.
    """

    POLL_S = 0.02
    FINISH: dict[str, FinishReason] = {"client_gone": "abort", "shutdown": "abort", "timeout": "timeout"}

    def __init__(self, timeout_s: float | None = None):
        self._event = threading.Event()
        self.reason: str | None = None
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s if timeout_s else None

    def cancel(self, reason: str) -> None:
        """End the request at its next step (the first reason given is kept)."""
        if self.reason is None:
            self.reason = reason
        self._event.set()

    def check(self) -> str | None:
        """The reason to stop now, or None."""
        if self.reason is None and self.deadline is not None and time.monotonic() >= self.deadline:
            self.cancel("timeout")
        return self.reason

    def wait(self, done: threading.Event) -> None:
        """Wait for ``done``; raise Stopped as soon as the request must end."""
        while not done.wait(self.POLL_S):
            if reason := self.check():
                raise Stopped(reason)

    def acquire(self, lock: threading.Lock) -> None:
        """Take ``lock``; raise Stopped (without it) as soon as the request must end."""
        while not lock.acquire(timeout=self.POLL_S):
            if reason := self.check():
                raise Stopped(reason)
