"""The settings of `lantern serve`: `ServerConfig` (which artifacts, the site, the API key, CORS, the
engine and its threads) and `Limits` (body size and time, max_tokens, queue length, deadlines). The
CLI fills them from its options; the tests and `lantern validate` build them directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


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
