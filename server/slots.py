"""The model slots: one `ModelSlot` per served artifact, with its generator (a chat model's) or its
embedder (an embedding model's), loaded on a background thread by the app's lifespan (a failure is
kept and reported on every request for that model), the count of requests waiting for it, when recent
ones finished (for Retry-After), and the worker threads its requests run on."""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..runtime.artifact import Artifact
from .config import ServerConfig
from .embeddings import Embedder
from .engine import Generator


class ModelSlot:
    """One model: its generator (engine.py, loaded in the background) and the queue in front of it."""

    def __init__(self, name: str, path: Path, config: "ServerConfig"):
        self.name, self.path, self.log = name, path, config.log or (lambda line: None)
        self.config = config
        self.generator: Generator | None = None  # a chat model's
        self.embedder: Embedder | None = None  # an embedding model's
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
            model: Generator | Embedder
            if Artifact.open(self.path, verify=False).manifest["model"].get("kind") == "embedding":
                model = self.embedder = Embedder(self.path, self.config.engine, threads=self.config.threads)
            else:
                model = self.generator = Generator(
                    self.path, self.config.engine, slots=self.config.parallel, threads=self.config.threads
                )
            self.log(f"{self.name}: {model.describe()}")
            self.log(f"{self.name} ready in {time.monotonic() - started:.1f} s")
        except Exception as err:  # noqa: BLE001 (reported on every request for this model)
            self.load_error = f"{type(err).__name__}: {err}"
            self.log(f"{self.name} failed to load: {self.load_error}")
        self.ready.set()

    @property
    def loaded(self) -> Generator | Embedder | None:
        return self.generator or self.embedder

    @property
    def kind(self) -> str:
        return "embedding" if self.embedder else "chat"
