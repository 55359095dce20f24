"""Test helpers: a loopback static server and headless Chromium with WebGPU (SwiftShader)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from lantern.browsers import CHROMIUM_ARGS, chromium_args, chromium_path  # noqa: F401 - CHROMIUM_ARGS: bench_webgpu

if TYPE_CHECKING:
    from lantern.runtime.artifact import Artifact

CHROMIUM = chromium_path() or "/usr/bin/chromium"


class _Handler(http.server.SimpleHTTPRequestHandler):
    routes: dict[str, Path] = {}

    def translate_path(self, path: str) -> str:
        path = path.split("?", 1)[0].split("#", 1)[0]
        for prefix, root in sorted(self.routes.items(), key=lambda kv: -len(kv[0])):
            if path.startswith(prefix):
                rel = path[len(prefix) :].lstrip("/")
                target = (root / rel).resolve()
                if root.resolve() in target.parents or target == root.resolve():
                    return str(target)
        return "/nonexistent"

    def log_message(self, *args) -> None:  # keep test output quiet
        pass


class _IsolatedHandler(_Handler):
    """With COOP/COEP, so the page is cross-origin isolated (threads in wasm, e.g. wllama's, need it)."""

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()


_Handler.extensions_map = {
    **http.server.SimpleHTTPRequestHandler.extensions_map,
    ".wasm": "application/wasm",
    ".js": "text/javascript",
}


@contextlib.contextmanager
def serve(routes: dict[str, Path], isolated: bool = False) -> Iterator[str]:
    """Serve ``{url prefix: folder}`` on 127.0.0.1 (``isolated``: cross-origin isolated); yields the base URL."""
    base = _IsolatedHandler if isolated else _Handler
    handler = type("Handler", (base,), {"routes": {k: Path(v) for k, v in routes.items()}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def launch(playwright, webgpu: bool = True):
    """A headless Chromium from a running Playwright, WebGPU enabled unless asked otherwise."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=chromium_args(webgpu))


@contextlib.contextmanager
def chromium(webgpu: bool = True) -> Iterator[object]:
    """A headless Chromium browser (Playwright), WebGPU enabled unless asked otherwise."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p, webgpu)
        try:
            yield browser
        finally:
            browser.close()


@functools.cache
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


TVMJS = repo_root() / "webruntime" / "node_modules" / "@mlc-ai" / "web-runtime" / "lib"
WEBLLM = repo_root() / "webruntime" / "node_modules" / "@mlc-ai" / "web-llm" / "lib"


@contextlib.contextmanager
def probe_page(model_dir: Path) -> Iterator[tuple[object, str]]:
    """The tvmjs probe page (tests/web/model_probe.*) with ``model_dir`` served; yields (page, model URL)."""
    routes = {"/tvmjs/": TVMJS, "/probe/": repo_root() / "tests" / "web", "/models/m/": model_dir}
    with serve(routes) as base, chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/probe/model_probe.html")
        yield page, base + "/models/m/"


def webllm_chat(
    artifact, messages: list[dict], max_tokens: int, library: str | None = None, sampling: dict | None = None
) -> dict:
    """Load ``artifact`` in the unmodified WebLLM engine and answer; returns the OpenAI reply.
    ``library`` defaults to the one Lantern's runtime picks on SwiftShader (a WebLLM user names the
    library in their ModelRecord). ``sampling``: the request's sampling fields (default: greedy;
    ``{}`` leaves them to the artifact's mlc-chat-config.json)."""
    lib = library or artifact.library("webgpu", emulated=True).name
    # WebLLM appends resolve/main/ to a model URL unless it already holds /resolve/<rev>/
    routes = {"/webllm/": WEBLLM, "/page/": repo_root() / "tests" / "web", "/models/m/resolve/main/": artifact.path}
    with serve(routes) as base, chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/page/webllm_chat.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        model = f"{base}/models/m/resolve/main/"
        return page.evaluate(
            "([m, l, msgs, n, s]) => webllmChat(m, l, msgs, n, s)",
            [model, model + lib, messages, max_tokens, {"temperature": 0} if sampling is None else sampling],
        )


WLLAMA = repo_root() / "webruntime" / "node_modules" / "@wllama" / "wllama" / "esm"


def wllama_complete(parts: list[Path], prompts: list[str], max_tokens: int, threads: int = 1) -> list[dict]:
    """Greedy raw-text completions of ``prompts`` by llama.cpp (wllama in Chromium, on the CPU) on the
    GGUF ``parts`` (one folder); each {text, prompt_tokens, finish_reason}."""
    routes = {"/wllama/": WLLAMA, "/page/": repo_root() / "tests" / "web", "/gguf/": parts[0].parent}
    with serve(routes, isolated=threads > 1) as base, chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/page/wllama_chat.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        return page.evaluate(
            "([u, p, n, t]) => wllamaComplete(u, p, n, t)",
            [[f"{base}/gguf/{p.name}" for p in parts], prompts, max_tokens, threads],
        )


@contextlib.contextmanager
def lantern_server(
    model_dirs, site: Path | None = None, customize=None, engine: str = "auto"
) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """``lantern serve``'s app on a free loopback port (real uvicorn, in a thread).

    ``model_dirs`` is a list of artifact folders (served by ``engine``) or a whole ``ServerConfig``.
    ``customize(app)`` may add middleware (fault injection). Yields the base URL and the
    requests the server saw, in order, as (path, Range header or None).
    """
    from lantern.server.app import ServerConfig, create_app
    from lantern.server.background import serve_in_thread

    config = model_dirs if isinstance(model_dirs, ServerConfig) else ServerConfig(list(model_dirs), site, engine=engine)
    if config.site is None:
        config.site = repo_root() / "tests" / "web"
    app = create_app(config)
    seen: list[tuple[str, str | None]] = []
    if customize is not None:
        customize(app)

    @app.middleware("http")
    async def record(request, call_next):
        seen.append((request.url.path, request.headers.get("range")))
        return await call_next(request)

    with serve_in_thread(app) as base:
        yield base, seen


def manifest_alias(
    alias: str, folder: Path, edit: Callable[[dict], dict], files: dict[str, bytes] | None = None
) -> Callable[[object], None]:
    """A ``customize`` for lantern_server: ``/<alias>/lantern.json`` is ``folder``'s manifest after
    ``edit`` (a model the server itself does not load, e.g. one that claims sizes no browser fits),
    ``files`` replace some of the folder's files (the manifest then lists their sizes and hashes),
    and every other ``/<alias>/`` file is the served ``folder``'s own."""
    import hashlib

    from starlette.responses import JSONResponse, Response

    manifest = edit(json.loads((folder / "lantern.json").read_text()))
    files = files or {}
    for name, data in files.items():
        manifest["files"][name] = {**manifest["files"][name], "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def customize(app) -> None:
        @app.middleware("http")
        async def aliased(request, call_next):
            path = request.url.path
            if path == f"/{alias}/lantern.json":
                return JSONResponse(manifest)
            if path.startswith(f"/{alias}/"):
                name = path[len(alias) + 2 :]
                if name in files:
                    return Response(files[name], media_type="application/json")
                request.scope["path"] = f"/models/{folder.name}/{name}"
            return await call_next(request)

    return customize


def token_matrices(art: Artifact) -> list[list[int]]:
    """[n, k, count] of every q4 matrix one decoded token reads (the head through a tied embedding)."""
    index = json.loads((art.path / "tensor-cache.json").read_text())
    shapes: dict[tuple[int, int], int] = {}
    config = json.loads((art.path / "mlc-chat-config.json").read_text())["model_config"]
    for shard in index["records"]:
        for rec in shard["records"]:
            if not rec["name"].endswith("q_weight"):
                continue
            if "embed_tokens" in rec["name"] and not config["tie_word_embeddings"]:
                continue  # an untied embedding is only looked up, never multiplied
            n, k = rec["shape"][0], rec["shape"][1] * 8
            shapes[(n, k)] = shapes.get((n, k), 0) + 1
    return [[n, k, count] for (n, k), count in shapes.items()]


def serve_process(args: list[str], command: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """``lantern serve ARGS --port P`` as its own process (it can get signals) on a free loopback port,
    once its /health says ok: (the process, its stderr a text pipe; the base URL). ``command``:
    another `lantern serve` (default: this Python's)."""
    import socket
    import sys
    import time
    import urllib.request

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    command = command or [sys.executable, "-m", "lantern.cli", "serve"]
    proc = subprocess.Popen([*command, *args, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(3000):
        if proc.poll() is not None:
            raise RuntimeError(f"lantern serve exited ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        try:
            if json.load(urllib.request.urlopen(base + "/health", timeout=2))["status"] == "ok":
                return proc, base
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError("lantern serve did not get ready in 5 minutes")


def wait_until_ready(base: str) -> None:
    """Poll ``lantern serve``'s /health until its CPU models have loaded."""
    import json
    import time
    import urllib.request

    for _ in range(600):
        if json.load(urllib.request.urlopen(base + "/health"))["status"] == "ok":
            return
        time.sleep(0.1)
    raise TimeoutError("the server's CPU models did not load")


# --------------------------------------------------------------------------- the WebGPU library probe


def probe(art: Artifact, steps: list[list[int]], lib: str | None = None, upcast: bool = False) -> list[np.ndarray]:
    """Run the steps (prefill or decode each) on WebGPU; return each step's last logits.

    ``lib`` defaults to the library a device without optional features runs; ``upcast`` loads float16
    weights as float32 (what a runtime does for an f16 artifact's fallback library).
    """
    lib = lib or art.library("webgpu").name
    with probe_page(art.path) as (page, model_url):
        result = page.evaluate(
            "([u, l, s, up]) => runProbe(u, l, s.map(t => ({tokens: t})), up)", [model_url, lib, steps, upcast]
        )
    return [np.array(x, dtype=np.float32) for x in result["logits"]]


def multi_turn_steps(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    draw = lambda n: [int(t) for t in rng.integers(0, 49152, n)]  # noqa: E731
    # first prefill, two decodes, then a second prefill on top of the history (a new chat turn)
    return [draw(21), draw(1), draw(1), draw(13)]


def check_against_cpu(art: Artifact, steps, rtol: float, report, lib: str) -> None:
    cpu = art.cpu_model()
    expected = [cpu.prefill(s) for s in steps]
    got = probe(art, steps, lib=lib)
    for i, (e, g) in enumerate(zip(expected, got)):
        err = np.abs(e - g).max() / np.abs(e).max()
        report(f"{lib} WebGPU vs CPU, step {i} ({len(steps[i])} tokens): logit error {err:.1e} (relative)")
        assert err < rtol, f"step {i} ({len(steps[i])} tokens): relative logit error {err:.2e}"


def logprob_rows(reply: dict) -> list:
    """A chat completion's logprobs as comparable rows: (token, logprob, top (token, logprob)s) per token."""
    return [
        (t["token"], t["logprob"], [(x["token"], x["logprob"]) for x in t["top_logprobs"]])
        for t in reply["choices"][0]["logprobs"]["content"]
    ]
