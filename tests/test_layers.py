"""The Python package's layers, lowest first: a module imports only from its own layer or below
(read from the source with ast; no import runs). docs/architecture.md, "Layout", names the same layers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"lantern": ROOT / "compiler", "lantern.models": ROOT / "models", "lantern.server": ROOT / "server"}
# Modules above the first layer (models and the compiler: every other module). A prefix names a package.
LAYERS = {
    "artifact and CPU runtime": ("lantern.runtime",),
    "server": ("lantern.server",),
    "validator": ("lantern.validate",),
    "CLI": ("lantern.cli",),
}
NAMES = ["models and compiler", *LAYERS]


def layer(module: str) -> int:
    for i, prefixes in enumerate(LAYERS.values(), start=1):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return 0


def modules() -> dict[str, Path]:
    out = {}
    for package, folder in SOURCES.items():
        for f in folder.rglob("*.py"):
            parts = [p for p in f.relative_to(folder).with_suffix("").parts if p != "__init__"]
            name = ".".join([package, *parts])
            if not any(name.startswith(p + ".") for p in SOURCES if p != package and p.startswith(package + ".")):
                out[name] = f
    return out


def imports(name: str, path: Path) -> set[str]:
    """The lantern modules ``path`` (module ``name``) imports, relative imports resolved."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            # `from . import x` imports the module x; `from .m import y` the module m
            found |= {f"{base}.{a.name}" for a in node.names} if node.module is None else {base}
    return {m for m in found if m == "lantern" or m.startswith("lantern.")}


def test_every_module_imports_only_from_its_layer_or_below():
    found = modules()
    assert {
        "lantern.pipeline",
        "lantern.runtime.runner",
        "lantern.server.app",
        "lantern.validate",
        "lantern.cli",
        "lantern.models.llama.model",
    } <= found.keys()
    upward = []
    for name, path in sorted(found.items()):
        for target in sorted(imports(name, path)):
            if layer(target) > layer(name):
                upward.append(f"{name} ({NAMES[layer(name)]}) imports {target} ({NAMES[layer(target)]})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "pipeline.py"
    bad.write_text("from .server.app import create_app\nfrom .runtime.runner import CpuModel\n")
    assert imports("lantern.pipeline", bad) == {"lantern.server.app", "lantern.runtime.runner"}
    assert layer("lantern.server.app") > layer("lantern.runtime.runner") > layer("lantern.pipeline")
