"""The package outside the checkout: `python -m build` makes an sdist and, from the sdist alone, a wheel
with the site and the browser runtime; installed into a fresh virtual environment and run from a
temporary directory, its `lantern serve` answers /, /runtime/lantern.js and /v1/models for an artifact.
(`pip wheel .` builds the same wheel from the checkout.)

The fresh environment takes its dependencies (TVM, FastAPI, ...) from this one's site-packages
through a .pth file rather than installing them again (minutes of downloads); Lantern itself is
only the wheel: the editable install's import hook lives in a .pth file of this environment, which
Python does not read for the fresh one (the test checks where `lantern` is imported from)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
import venv
from pathlib import Path

import pytest

from lantern.server.static import RUNTIME_FILES

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel of this checkout installed; returns its bin/ folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(ROOT)], capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr[-2000:]
    for noise in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "would be ignored"):  # setuptools' complaints
        assert noise not in build.stdout + build.stderr, build.stdout + build.stderr
    wheel = next((tmp / "dist").glob("lantern_llm-*.whl"))
    env = tmp / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
    )
    return env / "bin"


def test_the_wheel_carries_the_site_and_the_runtime(installed, tmp_path):
    where = subprocess.run(
        [str(installed / "python"), "-c", "import lantern; print(lantern.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    package = Path(where).parent
    assert installed.parent in package.parents, where  # the wheel's copy, not the checkout
    for name in sorted(RUNTIME_FILES):
        assert (package / "webruntime" / name).read_bytes() == (ROOT / "webruntime" / "dist" / name).read_bytes()
    assert (package / "site" / "index.html").read_bytes() == (ROOT / "site" / "index.html").read_bytes()


def test_the_installed_cli_serves_site_runtime_and_api_from_a_temporary_directory(installed, tiny_q4, tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [str(installed / "lantern"), "serve", str(tiny_q4.path), "--port", str(port), "--engine", "tvm"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status, body = get(f"{base}/health")
                if json.loads(body).get("status") == "ok":
                    break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read() if server.poll() else "timeout"
            time.sleep(0.5)
        status, page = get(f"{base}/")
        assert status == 200 and page == (ROOT / "site" / "index.html").read_bytes()
        status, runtime = get(f"{base}/runtime/lantern.js")
        assert status == 200 and runtime == (ROOT / "webruntime" / "dist" / "lantern.js").read_bytes()
        status, models = get(f"{base}/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(models)["data"]] == [tiny_q4.path.name]
    finally:
        server.terminate()
        server.wait(timeout=30)
