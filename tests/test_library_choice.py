"""Which library a device runs: the browser's chooseLibrary (webruntime/src/library.ts, run under Node)
and Python's choose_library (compiler/package.py, used by the benchmark and tests) give the same answer
on every case, and the answers are the intended ones."""

from __future__ import annotations

import pytest

from test_structured import run_typescript

from lantern.package import choose_library


def lib(file: str, schedule: str | None = "gpu", features=(), upcast: bool = False, target: str = "webgpu") -> dict:
    entry = {
        "file": file,
        "target": target,
        "dtype": "float32",
        "required_features": list(features),
        "param_upcast": "float16->float32" if upcast else None,
    }
    if schedule is not None:
        entry["schedule"] = schedule
    return entry


BOTH = [lib("m-webgpu.wasm"), lib("m-webgpu-emulated.wasm", "cpu-emulated"), {**lib("m-cpu.so", None), "target": "cpu"}]
F16 = [
    lib("m-webgpu.wasm", features=["shader-f16"]),
    lib("m-webgpu-f32.wasm", upcast=True),
    lib("m-webgpu-emulated.wasm", "cpu-emulated", upcast=True),
]
SWIFTSHADER = {
    "vendor": "google",
    "architecture": "swiftshader",
    "description": "SwiftShader Device (Subzero)",
    "isFallbackAdapter": True,
}
# an embedding model's wasm libraries (the browser's wasm device): plain SIMD, and relaxed SIMD's twin
ENCODER = [
    lib("e-wasm.wasm", None, upcast=True, target="wasm"),
    lib("e-wasm-relaxed.wasm", None, ["relaxed-simd"], upcast=True, target="wasm"),
    lib("e-webgpu.wasm", features=["shader-f16"]),
]
# (libraries, adapter or engine features, software adapter?) -> the file it runs, or None for an error;
# on the wasm device where the case has wasm libraries, else on webgpu (target_of)
CASES = [
    (BOTH, [], True, "m-webgpu-emulated.wasm"),  # SwiftShader
    (BOTH, ["shader-f16", "subgroups"], False, "m-webgpu.wasm"),  # a real GPU
    (F16, ["shader-f16"], False, "m-webgpu.wasm"),
    (F16, [], False, "m-webgpu-f32.wasm"),  # a real GPU without shader-f16
    (F16, [], True, "m-webgpu-emulated.wasm"),
    ([lib("old.wasm", None)], [], True, "old.wasm"),  # no schedule field: a "gpu" library
    ([lib("m-webgpu-emulated.wasm", "cpu-emulated")], ["shader-f16"], False, "m-webgpu-emulated.wasm"),
    ([lib("future.wasm", "npu"), lib("m-webgpu.wasm")], [], True, "m-webgpu.wasm"),  # unknown schedule skipped
    ([lib("future.wasm", "npu")], [], True, None),
    ([lib("m-webgpu.wasm", features=["shader-f16"])], [], False, None),
    ([], [], False, None),
    (ENCODER, ["relaxed-simd"], False, "e-wasm-relaxed.wasm"),  # Chromium
    (ENCODER, [], False, "e-wasm.wasm"),  # an engine without relaxed SIMD
    (ENCODER[1:2], [], False, None),
]
ADAPTERS = [
    SWIFTSHADER,
    {"vendor": "nvidia", "architecture": "hopper", "description": "NVIDIA H200", "isFallbackAdapter": False},
    {"vendor": "mesa", "architecture": "", "description": "llvmpipe (LLVM 15.0.6, 256 bits)"},
    {"vendor": "microsoft", "architecture": "", "description": "Microsoft Basic Render Driver"},
    {"vendor": "apple", "architecture": "metal-3", "description": ""},
]
SOFTWARE = [True, False, True, True, False]


def target_of(libraries) -> str:
    """The cases' device: wasm for an embedding model's wasm libraries, else webgpu."""
    return "wasm" if any(entry["target"] == "wasm" for entry in libraries) else "webgpu"


def python_pick(libraries, features, emulated):
    try:
        return {"file": choose_library(libraries, target_of(libraries), frozenset(features), emulated)["file"]}
    except ValueError as err:
        return {"error": str(err)}


@pytest.fixture(scope="module")
def typescript():
    payload = {
        "cases": [{"libraries": libs, "features": f, "emulated": e, "target": target_of(libs)} for libs, f, e, _ in CASES],
        "adapters": ADAPTERS,
    }
    return run_typescript("library_choice.ts", payload)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_both_runtimes_pick_the_same_library(i, typescript):
    libraries, features, emulated, expected = CASES[i]
    ts, py = typescript["picks"][i], python_pick(libraries, features, emulated)
    if expected:
        assert ts == py == {"file": expected}
    else:
        # the same message, naming every library and what it needs
        error = "WebGPUUnavailableError" if target_of(libraries) == "webgpu" else "CapabilityError"
        assert "error" in py and ts["error"] == f"{error}: {py['error']}"
        for entry in libraries:
            assert entry["file"] in py["error"]


def test_software_adapters_are_recognised_and_named_as_such(typescript):
    assert typescript["software"] == SOFTWARE
    # what the chat and capability pages show the user
    assert typescript["labels"] == [
        "WebGPU (software adapter, slow)",
        "WebGPU (NVIDIA hopper)",
        "WebGPU (software adapter, slow)",
        "WebGPU (software adapter, slow)",
        "WebGPU (Apple metal-3)",
    ]
