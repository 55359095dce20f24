"""Stage 6: package. Writes the artifact folder: weights, configs, manifest, npm metadata.

Layout (WebLLM-compatible plus Lantern's manifest):

  lantern.json            manifest: every file's sha256 and size, build facts, versions
  mlc-chat-config.json    WebLLM's chat config (conv_template translated from Jinja)
  tensor-cache.json       shard index (records: name, shape, dtype, format, nbytes, byteOffset)
  params_shard_N.bin      weights, <= 32 MiB a shard
  tokenizer.json          HF tokenizers file
  tokenizer_config.json   chat template and special tokens (Lantern's runtime renders the Jinja)
  *.wasm / *.so           model libraries (webgpu / cpu)
  package.json, README.md npm metadata
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .request_rules import generation_fields

SHARD_BYTES = 32_000_000  # "<= 32 MB"; a larger single tensor gets a shard of its own
# Kernel schedules a webgpu library can have (see lower.py): for real GPUs, and for software adapters.
SCHEDULES = ("gpu", "cpu-emulated")
MANIFEST = "lantern.json"
MANIFEST_VERSION = 1

# Sampling fields an artifact may carry defaults for (lantern.json "generation"): name -> (OpenAI's
# default, used when neither the request nor the artifact sets the field, min, max or None). Both
# runtimes read this order: request, then artifact, then OpenAI. The fields, defaults and ranges are
# the request rules' (compiler/contracts/request_rules.json, "fallback"), which the browser reads too.
# WebLLM reads temperature, top_p and repetition_penalty from mlc-chat-config.json.
GENERATION_FIELDS: dict[str, tuple[float, float, float | None]] = generation_fields()
WEBLLM_GENERATION_FIELDS = ("temperature", "top_p", "repetition_penalty")


# The context a build gets unless --context-window says otherwise, as WebLLM's prebuilt models have it:
# the KV cache is allocated whole, and at a model's trained length it can outweigh the weights (Gemma 3
# 270M's 32k positions in float32: 1.2 GB; at 4096: 151 MB).
DEFAULT_CONTEXT = 4096


def check_generation_defaults(values: dict, source: str) -> dict:
    """``values`` (field -> number) checked against GENERATION_FIELDS; LanternError names ``source``
    (a file or a flag) and the field when one is out of range or not a number."""
    from .errors import LanternError

    out = {}
    for name, value in values.items():
        if name not in GENERATION_FIELDS:
            raise LanternError(f"{source}: unknown generation default '{name}' (known: {', '.join(GENERATION_FIELDS)})")
        _, lo, hi = GENERATION_FIELDS[name]
        integral = name == "top_k"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integral and value != int(value)):
            raise LanternError(f"{source}: {name} must be {'an integer' if integral else 'a number'}, got {value!r}")
        if value < lo or (hi is not None and value > hi):
            span = f"[{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
            raise LanternError(f"{source}: {name} must be in {span}, got {value!r}")
        out[name] = int(value) if integral else float(value)
    return out


def webllm_generation(defaults: dict) -> dict:
    """The sampling fields of mlc-chat-config.json: the artifact's defaults, else OpenAI's."""
    return {name: defaults.get(name, GENERATION_FIELDS[name][0]) for name in WEBLLM_GENERATION_FIELDS}


def set_generation_defaults(out: Path, defaults: dict) -> dict:
    """Rewrite an artifact folder's generation defaults (mlc-chat-config.json and lantern.json) and
    re-hash it; returns the new manifest. Defaults change neither weights nor libraries, so a cached
    build takes new ones without recompiling."""
    chat_path = out / "mlc-chat-config.json"
    chat = json.loads(chat_path.read_text())
    chat.update(webllm_generation(defaults))
    chat_path.write_text(json.dumps(chat, indent=2) + "\n")
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["generation"] = defaults
    write_readme(out, manifest)
    return write_manifest(out, manifest)


@dataclass
class Library:
    file: str
    target: str  # "webgpu", "wasm" (the CPU kernels in wasm: an encoder on the wasm device) or "cpu"
    dtype: str  # compute dtype
    required_features: list[str]
    kernels: int
    largest_kernel_bytes: int
    # f32 fallback for f16 weights: the runtime upcasts float16 params before upload.
    param_upcast: str | None = None
    # webgpu only: one of SCHEDULES; a library without it counts as "gpu"
    schedule: str | None = None
    # the context it runs: the artifact's, or a windowed model's window in its float16 and gpu-schedule
    # libraries (pipeline.library_config); its _metadata says the same
    context_window: int | None = None


def choose_library(libraries: list[dict], target: str, features: frozenset[str] = frozenset(), emulated: bool = False) -> dict:
    """The library of ``target`` that a device runs best, as the browser runtime picks it
    (``chooseLibrary`` in webruntime/src/library.ts is the twin; a test holds them equal).

    Usable: every required feature present and a known schedule. Best: weights as stored over an
    f32 upcast, then the schedule made for this kind of adapter (``emulated``: a software one), then
    the one that needs more of the device's features (made for them: wasm's relaxed SIMD).
    Raises ValueError naming each library and what it needs when none is usable.
    """
    want = "cpu-emulated" if emulated else "gpu"
    candidates = [lib for lib in libraries if lib["target"] == target]
    usable = [
        lib
        for lib in candidates
        if set(lib["required_features"]) <= features and (target != "webgpu" or (lib.get("schedule") or "gpu") in SCHEDULES)
    ]
    if not usable:
        needs = [
            f"{lib['file']} needs {' + '.join(lib['required_features'])}"
            if lib["required_features"]
            else f"{lib['file']} has the unknown schedule '{lib.get('schedule')}'"
            for lib in candidates
        ]
        raise ValueError(f"no {target} library runs here ({'; '.join(needs) or 'none was built'})")
    rank = lambda lib: (  # noqa: E731
        (2 if lib.get("param_upcast") else 0) + ((lib.get("schedule") or "gpu") != want),
        -len(lib["required_features"]),
    )
    return min(usable, key=rank)


# Files every browser device fetches besides its own: the tokenizer (chat template, grammars) and configs.
COMMON_DEVICE_FILES = ("lantern.json", "mlc-chat-config.json", "tokenizer.json", "tokenizer_config.json")


def shards_of(manifest: dict) -> list[str]:
    return sorted(f for f in manifest["files"] if f.startswith("params_shard_"))


def device_files(manifest: dict, device: str) -> list[str] | None:
    """What a browser device downloads from this artifact, or None when it cannot run it: ``webgpu``
    fetches one WebGPU library (the largest counts), the weight shards and their index; ``wasm``
    fetches an embedding model's wasm library, the weight shards and their index where it has one, else
    the GGUF parts."""
    if device == "webgpu":
        libs = [lib["file"] for lib in manifest["libraries"] if lib["target"] == "webgpu"]
        if not libs:
            return None
        largest = max(libs, key=lambda f: manifest["files"][f]["size"])
        own = [largest, "tensor-cache.json", *shards_of(manifest)]
    elif device == "wasm":
        libs = [lib["file"] for lib in manifest["libraries"] if lib["target"] == "wasm"]
        own = (
            [libs[0], "tensor-cache.json", *shards_of(manifest)]
            if libs
            else list((manifest.get("gguf") or {}).get("files") or [])
        )
        if not own:
            return None
    else:
        raise ValueError(f"unknown device '{device}' (webgpu or wasm)")
    return [*COMMON_DEVICE_FILES, *own]


def download_bytes(manifest: dict, device: str) -> int | None:
    """Bytes a browser device downloads from this artifact (None: the device cannot run it)."""
    files = device_files(manifest, device)
    sizes = {**manifest["files"], MANIFEST: {"size": 0}}  # the manifest does not list itself
    return None if files is None else sum(sizes[f]["size"] for f in files if f in sizes)


def write_shards(out: Path, names: list[str], arrays: list[np.ndarray]) -> dict:
    """Write params into shards of at most SHARD_BYTES; return the tensor-cache.json object."""
    shards: list[dict] = []
    current: list[tuple[str, np.ndarray]] = []
    size = 0

    def flush():
        nonlocal current, size
        if not current:
            return
        path = out / f"params_shard_{len(shards)}.bin"
        records, offset = [], 0
        with open(path, "wb") as f:
            for name, arr in current:
                data = np.ascontiguousarray(arr).tobytes()
                f.write(data)
                records.append(
                    {
                        "name": name,
                        "shape": list(arr.shape),
                        "dtype": str(arr.dtype),
                        "format": "raw",
                        "nbytes": len(data),
                        "byteOffset": offset,
                    }
                )
                offset += len(data)
        shards.append(
            {
                "dataPath": path.name,
                "format": "raw-shard",
                "nbytes": offset,
                "records": records,
                "md5sum": hashlib.md5(path.read_bytes()).hexdigest(),
            }
        )
        current, size = [], 0

    for name, arr in zip(names, arrays):
        if size and size + arr.nbytes > SHARD_BYTES:
            flush()
        current.append((name, arr))
        size += arr.nbytes
    flush()
    total = sum(s["nbytes"] for s in shards)
    count = sum(int(np.prod(a.shape)) for a in arrays)
    return {
        "metadata": {"ParamSize": len(names), "ParamBytes": total, "BitsPerParam": 8 * total / max(count, 1)},
        "records": shards,
    }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def npm_name(name: str, quant: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", f"{name}-{quant}".lower()).strip("-._")
    return f"lantern-model-{slug}"[:214]


def write_package_json(out: Path, name: str, quant: str, version: str, files: list[str]) -> None:
    pkg = {
        "name": npm_name(name, quant),
        "version": version,
        "description": f"{name} ({quant}) compiled by Lantern for WebGPU browsers",
        # what a browser fetches; the CPU library (.so) is for servers and stays out of the package
        "files": sorted(f for f in files if not f.endswith(".so")),
        # the folder is the model: `model: ".../node_modules/<name>/"`; files are addressable by path
        "exports": {".": f"./{MANIFEST}", "./*": "./*"},
        "keywords": ["lantern", "webgpu", "llm", "webllm"],
        "lantern": {"manifest": MANIFEST},
    }
    (out / "package.json").write_text(json.dumps(pkg, indent=2) + "\n")


def _readme_kind(manifest: dict) -> str:
    if manifest.get("embedding"):
        return f"- an embedding model: {embedding_summary(manifest)}\n"
    return (
        f"- 4-bit encoder: {encoder_summary(manifest)}\n"
        f"- estimated GPU memory: {manifest['memory']['estimated_gpu_bytes']:,} bytes\n"
        f"- sampling defaults (a request's own values win): {generation_summary(manifest)}\n"
    )


def _readme_use(manifest: dict) -> str:
    name = manifest["model"]["name"]
    if manifest.get("embedding"):
        return f"""Serve it with `lantern serve` and ask for vectors in OpenAI's shape:

```sh
curl localhost:8000/v1/embeddings -H 'content-type: application/json' \\
    -d '{{"model": "{name}", "input": ["a text", "another"]}}'
```"""
    return f"""Load it in a page with the Lantern runtime:

```js
import {{ createEngine }} from "/runtime/lantern.js";
const engine = await createEngine({{ model: "/models/{name}/" }});
```"""


def encoder_summary(manifest: dict) -> str:
    """How the artifact's weights were quantized, in a few words (README and the build summary)."""
    cal = manifest.get("calibration")
    if cal:
        return f"GPTQ on {cal['tokens']} tokens of {cal['text']}"
    return "round to nearest" if manifest["quantization"].startswith("q4") else "none (unquantized)"


def generation_summary(manifest: dict) -> str:
    """The artifact's sampling defaults in a few words (README and the build summary)."""
    defaults = manifest.get("generation") or {}
    return ", ".join(f"{k} {v:g}" for k, v in defaults.items()) or "OpenAI's (temperature 1, top_p 1)"


def embedding_summary(manifest: dict) -> str:
    """An embedding artifact's vectors, in one line."""
    e = manifest["embedding"]
    normalized = ", normalized" if e["normalize"] else ""
    return f"{e['dimensions']} dimensions, {e['pooling']} pooling{normalized}, up to {e['max_tokens']} tokens a text"


def write_readme(out: Path, manifest: dict) -> None:
    libs = "\n".join(
        f"- `{lib['file']}`: {lib['target']}, {lib['dtype']}"
        + (f", needs {', '.join(lib['required_features'])}" if lib["required_features"] else "")
        for lib in manifest["libraries"]
    )
    text = f"""# {manifest["model"]["name"]} ({manifest["quantization"]})

Built by Lantern {manifest["versions"]["lantern"]} from source `{manifest["source"]["sha256"][:16]}`.

- parameters: {manifest["model"]["parameters"]:,}; weights: {manifest["weights"]["bytes"]:,} bytes
- context window: {manifest["model"]["context_window"]} tokens
{_readme_kind(manifest)}
Libraries:
{libs}

{_readme_use(manifest)}

`lantern.json` lists every file with its sha256; the runtime refuses a file that does not match.
"""
    (out / "README.md").write_text(text)


def write_manifest(out: Path, manifest: dict) -> dict:
    """Hash every file in ``out`` into ``manifest['files']`` and write lantern.json."""
    files = {}
    for p in sorted(out.iterdir()):
        if p.is_file() and p.name != MANIFEST:
            files[p.name] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    manifest = dict(manifest, files=files)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def estimate_gpu_bytes(weight_bytes: int, cfg, dtype: str, context: int) -> int:
    """Weights + a full-context KV cache + activation workspace for one prefill chunk + one position's
    logits (prefill computes only the last)."""
    elt = 2 if dtype == "float16" else 4
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * context * elt
    act = cfg.prefill_chunk_size * (4 * cfg.hidden_size + 2 * cfg.intermediate_size) * 4
    logits = cfg.vocab_size * 4
    return int(weight_bytes + kv + act + logits)
