"""The package outside the checkout: `python -m build` makes an sdist and, from the sdist alone, a wheel
with the site and the browser runtime; installed into a fresh virtual environment and run from a
temporary directory, its `lantern serve` answers /, /runtime/lantern.js and /v1/models for an artifact.
(`pip wheel .` builds the same wheel from the checkout.)

The fresh environment is the light install, the wheel with its `llamacpp` extra: it takes its
dependencies (TVM, FastAPI, ...) from this one's site-packages, through a .pth file naming a folder of
links to them rather than installing them again (minutes of downloads), less what the wheel does not
require: torch, triton and the native xgrammar (the test extra's). There `lantern build`, `serve` (its
structured output on xgrammar's native core, fetched into the cache without torch) and `validate` work. Lantern itself is only the wheel: the
editable install's import hook lives in a .pth file of this environment, which Python does not read for
the fresh one (the test checks where `lantern` is imported from). docs/benchmarks.md has the light
install's size from the registry."""

from __future__ import annotations

import json
import os
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
# in this environment for the tests, not required by the wheel (nor by its llamacpp extra)
NOT_REQUIRED = ("torch", "triton", "xgrammar")


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
    # this environment's packages, less those the wheel does not require
    deps = tmp / "dependencies"
    deps.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if entry.name.split("-")[0].split(".")[0].lower() not in NOT_REQUIRED:
            (deps / entry.name).symlink_to(entry)
    (Path(site) / "dependencies.pth").write_text(f"{deps}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
    )
    return env / "bin"


def light_env() -> dict[str, str]:
    """This environment's variables, less a choice of xgrammar build: the installed CLI picks its own."""
    return {k: v for k, v in os.environ.items() if k != "LANTERN_XGRAMMAR"}


def run(bin_dir: Path, *args, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / args[0]), *map(str, args[1:])], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=light_env()
    )


def test_the_wheel_requires_no_torch(installed, tmp_path):
    meta = run(
        installed, "python", "-c", "import importlib.metadata as m; print(*m.requires('lantern-llm'), sep=chr(10))", cwd=tmp_path
    )
    required = [r for r in meta.stdout.splitlines() if "extra ==" not in r]
    assert required and not [r for r in required if r.split("=")[0].split(">")[0].strip() in NOT_REQUIRED], required
    assert any(r.startswith("xgrammar") and 'extra == "xgrammar"' in r for r in meta.stdout.splitlines())
    for name in NOT_REQUIRED:
        missing = run(installed, "python", "-c", f"import {name}", cwd=tmp_path)
        assert missing.returncode == 1 and "ModuleNotFoundError" in missing.stderr, missing.stderr


def test_the_light_install_builds_serves_structured_output_and_validates(installed, tiny_hf, tiny_q4, cache_dir, tmp_path):
    """`lantern build` (the tiny model with the default targets: a cache hit of tiny_q4's build, read and
    checked through the wheel's code), `lantern serve` on the llamacpp engine answering a JSON schema (xgrammar's
    native core, without torch), and `lantern validate` in Chromium, all from the light install."""
    art = tmp_path / "tiny"
    built = run(
        installed, "lantern", "build", tiny_hf[0], "--quant", "q4f32_1", "--out", art, "--cache-dir", cache_dir, cwd=tmp_path
    )
    assert built.returncode == 0 and (art / "lantern.json").exists(), built.stderr[-2000:]

    port = free_port()
    server = subprocess.Popen(
        [str(installed / "lantern"), "serve", str(art), "--port", str(port), "--engine", "llamacpp"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**light_env(), "LANTERN_CACHE": str(cache_dir)},
    )
    base = f"http://127.0.0.1:{port}"
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city", "rank"],
        "additionalProperties": False,
    }
    try:
        wait_healthy(server, base)
        body = {
            "model": art.name,
            "messages": [{"role": "user", "content": "A city and its rank, as JSON."}],
            "max_tokens": 40,
            "seed": 7,
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
        }
        request = urllib.request.Request(
            f"{base}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as r:
            choice = json.loads(r.read())["choices"][0]
    finally:
        server.terminate()
        log = server.communicate(timeout=30)[0]
    # no xgrammar package, no torch: the native core's bindings, fetched from the index into the cache
    assert "xgrammar's native build" in log, log[-3000:]
    assert list((cache_dir / "wheels" / "xgrammar-0.1.27").glob("xgrammar_bindings*.so"))
    if choice["finish_reason"] == "stop":  # a random model may be cut by max_tokens: then it is closed, not checked
        answer = json.loads(choice["message"]["content"])
        assert set(answer) == {"city", "rank"} and 1 <= answer["rank"] <= 9 and len(answer["city"]) <= 12, answer

    report = tmp_path / "report.json"
    validated = run(
        installed,
        "lantern",
        "validate",
        art,
        "--max-tokens",
        "6",
        "--ppl-tokens",
        "32",
        "--json",
        report,
        cwd=tmp_path,
        timeout=900,
    )
    assert validated.returncode == 0, validated.stdout[-2000:] + validated.stderr[-2000:]
    assert json.loads(report.read_text())["metrics"], "no metrics in the report"


def wait_healthy(server: subprocess.Popen, base: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            status, body = get(f"{base}/health")
            if json.loads(body).get("status") == "ok":
                return
        except OSError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, server.stdout.read() if server.poll() else "timeout"
        time.sleep(0.5)


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
        wait_healthy(server, base)
        status, page = get(f"{base}/")
        assert status == 200 and page == (ROOT / "site" / "index.html").read_bytes()
        status, runtime = get(f"{base}/runtime/lantern.js")
        assert status == 200 and runtime == (ROOT / "webruntime" / "dist" / "lantern.js").read_bytes()
        status, models = get(f"{base}/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(models)["data"]] == [tiny_q4.path.name]
    finally:
        server.terminate()
        server.wait(timeout=30)
