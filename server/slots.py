"""The model slots: one `ModelSlot` per served artifact, with its generator (loaded on a background
thread by the app's lifespan; a failure is kept and reported on every request for that model), the
count of requests waiting for it, when recent ones finished (for Retry-After), and the worker threads
its generations run on."""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .config import ServerConfig
from .engine import Generator


class ModelSlot:
    """One model: its generator (engine.py, loaded in the background) and the queue in front of it."""

    def __init__(self, name: str, path: Path, config: "ServerConfig"):
        self.name, self.path, self.log = name, path, config.log or (lambda line: None)
        self.config = config
        self.generator: Generator | None = None
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
            self.generator = Generator(self.path, self.config.engine, slots=self.config.parallel, threads=self.config.threads)
            self.log(f"{self.name}: {self.generator.describe()}")
            self.log(f"{self.name} ready in {time.monotonic() - started:.1f} s")
        except Exception as err:  # noqa: BLE001 (reported on every request for this model)
            self.load_error = f"{type(err).__name__}: {err}"
            self.log(f"{self.name} failed to load: {self.load_error}")
        self.ready.set()
