"""The `lantern serve` application."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from .static import REPO, model_folders, mount_static


def create_app(model_dirs: list[Path], site: Path | None = None) -> FastAPI:
    models = model_folders(model_dirs)
    app = FastAPI(title="Lantern", docs_url=None, redoc_url=None)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "models": sorted(models)}

    mount_static(app, models, site if site is not None else REPO / "site")
    return app
