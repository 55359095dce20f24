"""Stage 5: link. Turns a webgpu executable into a wasm model library with Debian's emscripten.

The wheel ships no prebuilt wasm runtime, but it ships the sources: TVM's web
runtime (``tvm/web/emcc/*.cc``, ``tvm/src``, ``tvm_ffi/src``) is compiled once
per toolchain into wasm object files and cached by content hash. Seven headers
the wheel lacks come from the ``tilelang`` wheel's TVM tree at build time; two
more are small shims of ours (``wasm_shims/``).

Everything is compiled to wasm OBJECT files: Debian's wasm-ld 14 cannot read
the LLVM 22 bitcode that TVM would otherwise emit.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from .cache_lock import cache_lock
from .errors import LanternError
from .wheels import pip_download

RUNTIME_UNITS = ("wasm_runtime.cc", "tvmjs_support.cc", "webgpu_runtime.cc")
CFLAGS = ["-O3", "-std=c++17", "-Wno-ignored-attributes"]
# -O1 at link time: the objects are already optimized (-O3), and binaryen's whole-module -O3 pass
# took ~75 s of a ~78 s link for a 5 MB library, for a 13% smaller gzipped file. --strip-all drops
# the name section (1.4 MB) that -O1 would otherwise keep.
LDFLAGS = [
    "-O1",
    "-Wl,--strip-all",
    "--no-entry",
    "-s",
    "WASM_BIGINT=1",
    "-s",
    "ERROR_ON_UNDEFINED_SYMBOLS=0",
    "-s",
    "STANDALONE_WASM=1",
    "-s",
    "ALLOW_MEMORY_GROWTH=1",
    "-s",
    "INITIAL_MEMORY=64MB",
]
# Headers missing from the apache-tvm wheel, taken from tilelang's copy of the TVM tree.
HEADER_WHEEL = "tilelang==0.1.15"
HEADERS_FROM_WHEEL = (
    "include/tvm/support/io.h",
    "include/tvm/support/serializer.h",
    "src/support/arena.h",
    "src/support/base64.h",
    "src/support/bytes_io.h",
    "src/support/ring_buffer.h",
    "src/support/utils.h",
)
SHIMS = Path(__file__).parent / "wasm_shims"
# One compile of the runtime at a time, per process (the thread lock) and per cache (the file lock): a
# second caller (a build while the test suite's background start is still compiling it, or another
# process) waits for the first and takes its objects.
_RUNTIME_LOCK = threading.Lock()


def emscripten_version() -> str | None:
    emcc = shutil.which("emcc")
    if not emcc:
        return None
    out = subprocess.run([emcc, "--version"], capture_output=True, text=True).stdout
    first = out.splitlines()[0] if out else ""
    return first.split(")", 1)[-1].strip() or first


def _require_emcc() -> None:
    if not shutil.which("emcc") or not shutil.which("em++"):
        raise LanternError(
            "emscripten is not installed (emcc not found): `apt-get install emscripten`, or build with --targets cpu"
        )


def _wheel_dirs() -> tuple[Path, Path]:
    import tvm
    import tvm_ffi

    return Path(tvm.__file__).parent, Path(tvm_ffi.__file__).parent


def _runtime_key() -> str:
    tvm_dir, ffi_dir = _wheel_dirs()
    h = hashlib.sha256()
    h.update(f"{emscripten_version()}|{HEADER_WHEEL}|{CFLAGS}".encode())
    for unit in RUNTIME_UNITS:
        h.update((tvm_dir / "web" / "emcc" / unit).read_bytes())
    for p in sorted(SHIMS.rglob("*.h")):
        h.update(p.read_bytes())
    import tvm
    import tvm_ffi

    h.update(f"{tvm.__version__}|{tvm_ffi.__version__}".encode())
    return h.hexdigest()[:20]


def _missing_headers(dest: Path, cache_dir: Path) -> None:
    wheel_dir = cache_dir / "wheels"
    wheels = list(wheel_dir.glob("tilelang-*.whl"))
    if not wheels:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        wheels = pip_download(HEADER_WHEEL, wheel_dir, "tilelang-*.whl", "(needed for TVM headers)")
    with zipfile.ZipFile(wheels[0]) as zf:
        for rel in HEADERS_FROM_WHEEL:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(f"tilelang/3rdparty/tvm/{rel}"))


def _assemble_tree(root: Path, cache_dir: Path) -> None:
    """Lay the wheel sources out the way TVM's web/Makefile expects its source tree."""
    tvm_dir, ffi_dir = _wheel_dirs()
    shutil.copytree(tvm_dir / "include", root / "include")
    shutil.copytree(tvm_dir / "src", root / "src")
    shutil.copytree(tvm_dir / "web" / "emcc", root / "web" / "emcc")
    ffi = root / "3rdparty" / "tvm-ffi"
    shutil.copytree(ffi_dir / "include", ffi / "include")
    shutil.copytree(ffi_dir / "src", ffi / "src")
    shutil.copytree(ffi_dir / "include" / "dlpack", ffi / "3rdparty" / "dlpack" / "include" / "dlpack")
    shutil.copytree(SHIMS, root, dirs_exist_ok=True)
    _missing_headers(root, cache_dir)


def runtime_objects(cache_dir: Path, on_step: Callable[[str], None] = lambda _: None) -> list[Path]:
    """Compile (once per toolchain, cached) TVM's web runtime into wasm object files."""
    _require_emcc()
    key = _runtime_key()
    with (
        _RUNTIME_LOCK,
        cache_lock(
            cache_dir / "webruntime" / f"{key}.lock", lambda: on_step("runtime: waiting for another process compiling it")
        ),
    ):
        return _runtime_objects(cache_dir, key, on_step)


def _runtime_objects(cache_dir: Path, key: str, on_step: Callable[[str], None]) -> list[Path]:
    out_dir = cache_dir / "webruntime" / key
    objects = [out_dir / f"{Path(u).stem}.o" for u in RUNTIME_UNITS]
    if all(o.exists() for o in objects):
        return objects
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=out_dir.parent))
    try:
        root = work / "tvm"
        _assemble_tree(root, cache_dir)
        includes = [
            f"-I{root}",
            f"-I{root / 'include'}",
            f"-I{root / '3rdparty/tvm-ffi/include'}",
            f"-I{root / '3rdparty/tvm-ffi/3rdparty/dlpack/include'}",
            f"-I{root / '3rdparty/compiler-rt'}",
        ]

        def compile_unit(unit: str) -> None:
            on_step(f"runtime: {unit}")
            cmd = ["em++", *CFLAGS, *includes, "-c", "-o", str(work / f"{Path(unit).stem}.o"), str(root / "web" / "emcc" / unit)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise LanternError(f"compiling TVM's web runtime ({unit}) failed: {proc.stderr.strip()[-800:]}")

        with ThreadPoolExecutor(max_workers=max(1, min(len(RUNTIME_UNITS), os.cpu_count() or 1))) as pool:
            list(pool.map(compile_unit, RUNTIME_UNITS))
        staged = work / "objects"
        staged.mkdir()
        for o in objects:
            (work / o.name).rename(staged / o.name)
        shutil.rmtree(out_dir, ignore_errors=True)
        staged.rename(out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return objects


def link_wasm(executable, out: Path, cache_dir: Path, on_step: Callable[[str], None] = lambda _: None) -> None:
    """Link a webgpu executable plus the web runtime into ``out`` (a .wasm tvmjs can instantiate)."""
    runtime = runtime_objects(cache_dir, on_step)

    def emcc_link(output: str, objects: list[str], options=None) -> None:
        cmd = ["emcc", *LDFLAGS, "-o", output, *map(str, runtime), *objects, *(options or [])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise LanternError(f"linking {Path(output).name} failed: {proc.stderr.strip()[-800:]}")

    emcc_link.object_format = "o"  # type: ignore[attr-defined]  # export_library reads fcompile.object_format
    on_step(f"link {out.name}")
    executable.export_library(str(out), fcompile=emcc_link)
