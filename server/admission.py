"""The admission queue: `Server`, the state the routes share (the configuration, the slots, the
metrics, the requests in flight), picks the model a request names, admits it to that model's queue or
refuses it (429 with a Retry-After when the queue is full, 503 while loading or shutting down), and
runs an admitted generation on the slot's worker threads. streaming.respond answers with what it makes."""

from __future__ import annotations

import asyncio
import functools
import math
import time

from .config import ServerConfig
from .engine import InvalidRequest, Step, Stop
from .errors import ApiError
from .metrics import Metrics
from .protocol import EmbeddingRequest, SamplingFields
from .slots import ModelSlot
from .static import model_folders


class Server:
    """What the routes share: the configuration, one ModelSlot per served artifact, the metrics, and
    the steps every generation takes (pick the model, admit to its queue, run; streaming.respond
    answers)."""

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

    def slot_for(self, req: SamplingFields | EmbeddingRequest, kind: str = "chat") -> ModelSlot:
        """The loaded model ``req`` names (or the only one) of ``kind`` ("chat" or "embedding"), with
        room in its queue; ApiError otherwise."""
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
        if slot.kind != kind:
            raise ApiError(
                400,
                f"model {name} is an embedding model: it answers /v1/embeddings, not text"
                if slot.kind == "embedding"
                else f"model {name} is a chat model: it has no pooling for embeddings (serve an embedding model)",
                param="model",
                code="wrong_model_kind",
            )
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
    def release(slot: ModelSlot) -> None:
        """Give back an admitted request's place, noting when it ended (Retry-After)."""
        slot.waiting -= 1
        slot.finished.append(time.monotonic())

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
        assert slot.generator is not None  # slot_for admits only a loaded model

        def step(s: Step) -> None:
            if s.finish is not None:  # the terminal step, also for a client that has gone away
                self.metrics.observe(s)
            on_step(s)

        try:
            await asyncio.get_running_loop().run_in_executor(
                slot.executor, functools.partial(slot.generator.generate, prompt, req, stop, step, **constraint)
            )
        except InvalidRequest as err:
            raise ApiError(400, str(err)) from None
        except asyncio.CancelledError:
            stop.cancel("shutdown")
            raise
        finally:
            self.release(slot)

    @staticmethod
    def prepare(slot: ModelSlot, prompt_text: str, req: SamplingFields, raw: bool = False) -> list[int]:
        """The prompt's tokens (``raw``: a completion's prompt, see Generator.encode)."""
        assert slot.generator is not None  # slot_for admits only a loaded model
        try:
            slot.generator.sampling(req)  # reject bad sampling fields before queueing
        except InvalidRequest as err:
            raise ApiError(400, str(err)) from None
        return slot.generator.encode(prompt_text, raw=raw)
