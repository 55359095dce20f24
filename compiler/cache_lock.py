"""An exclusive lock on one entry of the build cache, held across processes.

Two builds of the same inputs at the same time (two terminals, two CI jobs, two test workers) then
do the work once: the second waits for the first and finds its result in the cache. The lock is an
advisory ``flock`` on a small file beside the entry; the kernel drops it when its holder exits, so a
killed build never leaves the cache locked. Where ``fcntl`` is missing (Windows) nothing is locked
and concurrent builds simply both do the work, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux or macOS
    fcntl = None  # type: ignore[assignment]  # None: cache_lock then holds no lock


@contextlib.contextmanager
def cache_lock(path: Path, on_wait: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Hold ``path`` (created if missing) exclusively; ``on_wait()`` runs once if another holds it."""
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
