"""The static half of `lantern serve`: the site at /, the runtime at /runtime/, artifacts at /models/<name>/.

Files are answered by Starlette's FileResponse (ETag, Last-Modified, HTTP Range). Every path is
resolved inside its root folder; anything that would leave it is a 404.
"""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, JSONResponse

from ..errors import LanternError
from ..package import MANIFEST

mimetypes.add_type("application/wasm", ".wasm")
mimetypes.add_type("text/javascript", ".js")

# The site and the bundled runtime: in a checkout (an editable install) the source folders, site/ and
# webruntime/dist/; in an installed wheel their copies in the lantern package, lantern/site/ and
# lantern/webruntime/ (pyproject.toml's package-dir).
_ROOT = Path(__file__).resolve().parent.parent  # the checkout, or the installed lantern package
CHECKOUT = (_ROOT / "webruntime" / "package.json").exists()
SITE = _ROOT / "site"
RUNTIME = _ROOT / "webruntime" / "dist" if CHECKOUT else _ROOT / "webruntime"
# worker.js / shared-worker.js: the engine in a page's own worker / shared by the origin's tabs;
# encoder-worker.js: the wasm device's workers for an embedding model's wasm library (cpu-encoder.ts)
# ai-sdk.js: the Vercel AI SDK provider (imports ./lantern.js); ai.js: the `ai` package, for the embed page
# schema-check.js: ajv (JSON Schema 2020-12), for pages that show whether structured output validates
# wllama.wasm: llama.cpp for the wasm device; wllama-compat.{wasm,js}: its build for engines without
# memory64 or wasm exceptions (Safari's), with its own glue (webruntime/src/llama-builds.ts)
RUNTIME_FILES = {
    "lantern.js",
    "worker.js",
    "shared-worker.js",
    "encoder-worker.js",
    "ai-sdk.js",
    "ai.js",
    "schema-check.js",
    "wllama.wasm",
    "wllama-compat.wasm",
    "wllama-compat.js",
}


def runtime_dir() -> Path:
    """The bundled runtime (webruntime/dist), built by `npm run build` in webruntime/."""
    if not (RUNTIME / "lantern.js").exists():
        if CHECKOUT:
            raise LanternError(f"the browser runtime is not built: run `npm ci && npm run build` in {RUNTIME.parent}")
        raise LanternError(
            "this installation of Lantern has no browser runtime: its wheel was built before "
            "`npm ci && npm run build` in webruntime/"
        )
    return RUNTIME


def model_folders(dirs: list[Path]) -> dict[str, Path]:
    """``{name: folder}`` for artifact folders; the name is the folder's name."""
    out: dict[str, Path] = {}
    for d in dirs:
        name = Path(d).absolute().name  # the name as given: a symlink can rename a build
        d = d.resolve()
        if not (d / "lantern.json").is_file():
            raise LanternError(f"{d} is not a Lantern artifact (no lantern.json); build one with `lantern build`")
        if name in out:
            raise LanternError(f"two artifact folders are both named {name!r}; rename one")
        out[name] = d
    return out


def _file_in(root: Path, rel: str) -> Path:
    target = (root / rel).resolve()
    if root not in target.parents or not target.is_file():
        raise HTTPException(404, f"not found: {rel}")
    return target


HEADERS = {
    # cross-origin isolation, so multi-threaded wasm (SharedArrayBuffer) is allowed
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    # Artifact contents change only with a rebuild; revalidate by ETag rather than refetch.
    "Cache-Control": "no-cache",
}


class _File(FileResponse):
    """Read and sent 1 MiB at a time: FileResponse's 64 KiB (a worker-thread read and a send each)
    served a 1.5B model's GGUF at ~260 MB/s, a quarter of Python's http.server on the same machine."""

    chunk_size = 1 << 20


def _file(path: Path) -> FileResponse:
    return _File(path, headers=HEADERS)


def _kind(folder: Path) -> str:
    """The artifact's model kind, "chat" or "embedding" (pages pick their models by it)."""
    try:
        return json.loads((folder / MANIFEST).read_text())["model"].get("kind", "chat")
    except (OSError, ValueError, KeyError):
        return "chat"


def mount_static(app: FastAPI, models: dict[str, Path], site: Path | None) -> None:
    runtime = runtime_dir()

    @app.get("/models/index.json")
    def model_index() -> JSONResponse:
        return JSONResponse({"models": [{"name": n, "url": f"/models/{n}/", "kind": _kind(models[n])} for n in sorted(models)]})

    @app.get("/runtime/{name}")
    def runtime_file(name: str) -> FileResponse:
        if name not in RUNTIME_FILES:
            raise HTTPException(404, f"not found: /runtime/{name}")
        return _file(runtime / name)

    @app.get("/models/{name}/{rel:path}")
    def model_file(name: str, rel: str) -> FileResponse:
        if name not in models:
            raise HTTPException(404, f"no model named {name!r} is served")
        return _file(_file_in(models[name], rel))

    if site is not None:

        @app.get("/{rel:path}")
        def site_file(rel: str) -> FileResponse:
            if not rel or rel.endswith("/"):
                rel += "index.html"
            return _file(_file_in(site, rel))
