"""The build pipeline: import -> quantize -> compile -> link -> write, with a build cache.

Each stage is a function of the previous stage's value; ``build`` runs them in
order under a Reporter (the CLI draws progress bars, tests pass a silent one).
Output is atomic: everything is written to a temporary folder beside ``out``
and renamed into place at the end, so a failed build leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol, cast

import numpy as np

from . import __version__, chat_template, gguf_export, gptq, link, lower, package
from .cache_lock import cache_lock
from .errors import LanternError
from .importer import SourceModel, import_source
from .lora import adapter_hash, merge_lora
from .quantize import QuantSpec, get_quantization, quantize_params
from .tensors import Tensors, peak_rss_bytes, reset_peak_rss
from .wheels import default_cache_dir  # noqa: F401 - where the CLI, tests and benchmarks read it

STAGES = ("import", "quantize", "compile", "link", "write")


class ProgressSink(Protocol):
    """What a build reports its progress to: Reporter below, or the CLI's (cli.py: bars, or lines)."""

    def stage(self, name: str, total: int | None = None) -> contextlib.AbstractContextManager[None]: ...

    def advance(self, step: int = 1, detail: str = "") -> None: ...

    def log(self, message: str) -> None: ...


class Reporter:
    """Progress sink. The default one is silent."""

    @contextlib.contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[None]:
        yield

    def advance(self, step: int = 1, detail: str = "") -> None:
        pass

    def log(self, message: str) -> None:
        pass


# What `--targets` takes: the model libraries lower.py compiles, and the GGUF for llama.cpp.
TARGETS = (*lower.TARGETS, "gguf")


@dataclass
class BuildOptions:
    source: str
    out: Path
    quant: str | None = None  # None: the family's default (DEFAULT_QUANT)
    lora: Path | None = None
    # A draft model for speculation (server/speculation.py): a quantization of this model, or a .gguf file
    draft: str | None = None
    # Text for GPTQ on 4-bit builds; None rounds every weight to the nearest level instead.
    calibration: Path | None = gptq.DEFAULT_CALIBRATION
    targets: tuple[str, ...] = ()  # empty: the family's (Family.default_targets)
    webgpu_schedule: str = "both"  # see lower.SCHEDULE_CHOICES
    context_window: int | None = None  # tokens of KV memory the runtimes allocate; None: package.DEFAULT_CONTEXT
    # sampling defaults that override the source's generation_config.json (package.GENERATION_FIELDS)
    generation: dict = field(default_factory=dict)
    gguf_skipped: str | None = None  # set by build(): why the gguf target was dropped
    cache_dir: Path = field(default_factory=lambda: default_cache_dir())
    dump_dir: Path | None = None
    name: str | None = None
    use_cache: bool = True


@dataclass
class BuildResult:
    out: Path
    manifest: dict
    stage_seconds: dict[str, float]
    cached: bool
    reused_libraries: list[str] = field(default_factory=list)  # library files taken from the cache
    stage_peak_bytes: dict[str, int] = field(default_factory=dict)  # the process's peak RSS in each stage


class StageMeter:
    """Time and peak resident memory of each stage. The peak is reset at each stage's start where
    the kernel allows it (Linux), so a stage's number is its own; elsewhere it is the peak so far."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.peak_bytes: dict[str, int] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        reset_peak_rss()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = time.perf_counter() - t0
            self.peak_bytes[stage] = peak_rss_bytes()


def fit_context(config, requested: int | None, log: Callable[[str], None]):
    """The config with the context the artifact runs: the requested one (or DEFAULT_CONTEXT), at most
    the model's trained length."""
    trained = config.context_window_size
    if requested is not None and requested > trained:
        log(f"the model is trained on {trained} positions: context window {requested} capped at {trained}")
    return _with_context(config, min(requested or package.DEFAULT_CONTEXT, trained))


def _with_context(config, context: int):
    return dataclasses.replace(config, context_window_size=context, prefill_chunk_size=min(config.prefill_chunk_size, context))


def library_config(config, dtype: str, schedule: str | None):
    """The config one library is compiled for. A windowed model's libraries keep its windows in
    Lantern's attention kernels (emulated.custom_attention), except two kinds, whose context stops
    at the window instead (where windowed attention is full attention, so TVM's kernels are exact):
    float16 libraries, since Lantern's kernels are float32, and the gpu schedule's, since Lantern's
    decode kernel gives each sequence and KV head one thread, a handful of threads where TVM's
    tiled kernels keep a real GPU busy. Soft-capped attention (Gemma 2) runs Lantern's kernels
    anyway, so there the gpu schedule keeps the whole context."""
    if not config.windowed or dtype == "float32" and (schedule != "gpu" or config.attention_softcap):
        return config
    return _with_context(config, config.sliding_window)


def toolchain_versions() -> dict[str, str | None]:
    import tvm
    import tvm_ffi

    return {
        "lantern": __version__,
        "tvm": tvm.__version__,
        "tvm_ffi": tvm_ffi.__version__,
        "emscripten": link.emscripten_version(),
    }


# The modules the stored weights depend on; the rest of the compiler only shapes the libraries.
WEIGHT_MODULES = ("importer.py", "quantize.py", "gptq.py", "lora.py")


def _code_hash(weights_only: bool = False) -> str:
    """Hash of Lantern's own compiler code, so a changed compiler never reuses a stale build.
    ``weights_only`` hashes just what decides the weights (so a kernel change keeps GPTQ's result)."""
    from . import models

    here = Path(__file__).parent
    not_compiler = (here / "runtime", here / "validate")  # the layers above read artifacts, never make them
    files = [
        p
        for root in (here, Path(models.__file__).parent)
        for p in sorted(root.rglob("*"))
        if p.suffix in (".py", ".h") and not any(d in p.parents for d in not_compiler)
    ]
    if weights_only:
        files = [p for p in files if p.parent != here or p.name in WEIGHT_MODULES]
    h = hashlib.sha256()
    for p in files:
        h.update(p.read_bytes())
    return h.hexdigest()


def _hash(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _weights_key(src: SourceModel, opts: BuildOptions, calibration_hash: str | None) -> str:
    """What the stored weights depend on. Builds for other targets or schedules share them, so
    GPTQ (minutes) runs once for all of them."""
    return _hash(
        {
            "source": src.source_hash,
            "code": _code_hash(weights_only=True),
            "quant": opts.quant,
            "calibration": calibration_hash,
            "lora": adapter_hash(opts.lora) if opts.lora else None,
        }
    )


def _cache_key(weights_key: str, opts: BuildOptions, name: str, versions: dict) -> str:
    """What the whole artifact depends on: its weights, plus what the compiled libraries do."""
    return _hash(
        {
            "weights": weights_key,
            "code": _code_hash(),
            "targets": sorted(opts.targets),
            "schedule": opts.webgpu_schedule,
            "name": name,
            "versions": versions,
            "context": opts.context_window,
            "draft": _draft_key(opts.draft),
        }
    )


def _draft_key(draft: str | None) -> str | None:
    """What the artifact's draft depends on: its quantization's name, or its GGUF file's bytes."""
    if draft is None or not draft.endswith(".gguf"):
        return draft
    return package.sha256_file(Path(draft))


def _check_draft(draft: str, targets: tuple[str, ...], src: SourceModel) -> None:
    """Fail before any work on a draft that cannot be built: one for a model that does not generate, one
    without the gguf target, an unknown quantization, or a GGUF that is missing, split, or of another
    vocabulary (named with the model's)."""
    if src.family.kind != "chat":
        raise LanternError(f"--draft {draft}: a draft model speeds up generation; {src.name} is an {src.family.kind} model")
    if "gguf" not in targets:
        raise LanternError(f"--draft {draft}: a draft model is packed as a GGUF; add the gguf target (--targets ...,gguf)")
    if not draft.endswith(".gguf"):
        get_quantization(draft)
        return
    from tokenizers import Tokenizer

    from .gguf_file import GGUFFormatError, read

    path = Path(draft)
    if not path.is_file():
        raise LanternError(f"--draft {draft}: no such GGUF file")
    try:
        meta, _ = read(path)
    except (GGUFFormatError, OSError) as err:
        raise LanternError(f"--draft {path.name}: not a readable GGUF ({err})") from None
    if int(meta.get("split.count", 1)) > 1:
        raise LanternError(f"--draft {path.name}: a split GGUF; give one file (llama-gguf-split --merge)")
    theirs = list(meta.get("tokenizer.ggml.tokens") or [])
    vocab = Tokenizer.from_str(src.tokenizer.tokenizer_json).get_vocab(with_added_tokens=True)
    ours = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if theirs[: len(ours)] != ours or len(theirs) != len(ours):
        where = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
        raise LanternError(
            f"--draft {path.name}: its vocabulary ({len(theirs)} tokens, {meta.get('general.name', path.stem)}) is not "
            f"{src.name}'s ({len(ours)} tokens): token {where} is "
            f"{theirs[where] if where < len(theirs) else None!r} in the draft and {ours[where] if where < len(ours) else None!r} "
            "in the model; a draft must share the model's tokenizer"
        )


def _library_key(
    src: SourceModel, config, lib_spec: QuantSpec, target: str, schedule: str | None, metadata: dict, versions: dict
) -> str:
    """What one model library depends on: the family and its config (shapes), the spec, the target
    and schedule, the metadata compiled into it, Lantern's code and the toolchain. Not the weights."""
    return _hash(
        {
            "family": src.family.name,
            "config": dataclasses.asdict(config),
            "spec": dataclasses.asdict(lib_spec),
            "target": target,
            "schedule": schedule,
            "metadata": metadata,
            "code": _code_hash(),
            "versions": versions,
        }
    )


def _cached_library(opts: BuildOptions, key: str, dest: Path) -> dict | None:
    """Copy a cached library to ``dest``; returns its facts (kernels, largest, param_names), or None."""
    folder = opts.cache_dir / "libraries" / key
    if not (opts.use_cache and (folder / "facts.json").exists()) or opts.dump_dir:
        return None
    shutil.copyfile(folder / "library", dest)
    return json.loads((folder / "facts.json").read_text())


def _store_library(opts: BuildOptions, key: str, file: Path, facts: dict) -> None:
    if not opts.use_cache:
        return
    root = opts.cache_dir / "libraries"
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    shutil.copyfile(file, staging / "library")
    (staging / "facts.json").write_text(json.dumps(facts))
    shutil.rmtree(root / key, ignore_errors=True)
    try:
        staging.rename(root / key)
    except OSError:  # another build stored the same library meanwhile
        shutil.rmtree(staging, ignore_errors=True)


def _load_cached_weights(opts: BuildOptions, key: str) -> dict[str, np.ndarray] | None:
    path = opts.cache_dir / "weights" / f"{key}.npz"
    if not (opts.use_cache and path.exists()):
        return None
    with np.load(path) as stored:
        return {name: stored[name] for name in stored.files}


def _store_cached_weights(opts: BuildOptions, key: str, stored: dict[str, np.ndarray]) -> None:
    if not opts.use_cache:
        return
    folder = opts.cache_dir / "weights"
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **stored)  # type: ignore[arg-type]  # numpy's stub: a name might meet allow_pickle: bool
        os.replace(tmp, folder / f"{key}.npz")
    except BaseException:
        os.unlink(tmp)
        raise


# The weight format a build gets when none is asked for, per model kind: 4-bit f32 for chat models (it runs
# on every WebGPU adapter); float16 weights for embedding models, computed in float32 (docs/families.md,
# "Embedding models", has the measurements). Encoders are not quantized to 4 bits.
DEFAULT_QUANT = {"chat": "q4f32_1", "embedding": "q0f16"}
EMBEDDING_QUANTS = ("q0f32", "q0f16")


def _fallback_spec(spec: QuantSpec) -> QuantSpec:
    # The no-shader-f16 WebGPU library: same layout, f32 compute; the runtime upcasts f16 params.
    return dataclasses.replace(spec, model_dtype="float32")


def _install(tmp: Path, out: Path) -> None:
    """Move the finished folder into place; an older build at ``out`` is replaced whole."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; static hosts must read it
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build(opts: BuildOptions, reporter: ProgressSink | None = None) -> BuildResult:
    reporter = reporter or Reporter()
    if opts.quant is not None:
        get_quantization(opts.quant)  # an unknown name fails before anything is read
    for t in opts.targets:
        if t not in TARGETS:
            raise LanternError(f"unknown target '{t}' (choose from: {', '.join(TARGETS)})")
    if opts.targets and not set(opts.targets) & set(lower.TARGETS):
        raise LanternError("--targets needs webgpu, wasm or cpu: the gguf target is written next to a model library")
    if opts.webgpu_schedule not in lower.SCHEDULE_CHOICES:
        raise LanternError(f"unknown WebGPU schedule '{opts.webgpu_schedule}' (choose from: {', '.join(lower.SCHEDULE_CHOICES)})")
    if opts.context_window is not None and opts.context_window < 1:
        raise LanternError(f"context window must be a positive number of tokens, got {opts.context_window}")
    if opts.lora is not None and not opts.lora.is_dir():
        raise LanternError(f"LoRA adapter folder not found: {opts.lora}")
    overrides = package.check_generation_defaults(opts.generation, "generation option")
    meter = StageMeter()
    out = opts.out.resolve()
    if out.exists() and not (out / package.MANIFEST).exists():
        raise LanternError(f"{out} exists and is not a Lantern artifact; refusing to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)

    with contextlib.ExitStack() as held:  # the cache entry's lock, from the look-up to the store
        with meter("import"), reporter.stage("import"):
            src = import_source(opts.source, opts.cache_dir)
            quant = _resolve_quant(opts.quant, src.family.kind)
            opts = dataclasses.replace(opts, quant=quant, targets=_resolve_targets(opts.targets, src.family))
            spec = get_quantization(quant)
            calibration_hash = None
            if spec.quantized and opts.calibration is not None:
                calibration_hash = gptq.text_hash(opts.calibration)
            name = opts.name or src.name
            versions = toolchain_versions()
            if not set(opts.targets) & set(lower.LINKED):
                versions["emscripten"] = None  # not part of this build
            # Not part of any cache key: they change two small files, not weights or libraries.
            generation = {**package.check_generation_defaults(src.generation, src.generation_source), **overrides}
            weights_key = _weights_key(src, opts, calibration_hash)
            key = _cache_key(weights_key, opts, name, versions)
            cached = opts.cache_dir / "artifacts" / key
            if opts.use_cache:  # a build of the same inputs running elsewhere: wait for it, then take its result
                held.enter_context(
                    cache_lock(
                        cached.with_name(f"{key}.lock"),
                        lambda: reporter.log(f"waiting for another build of the same inputs ({key[:12]}) to finish"),
                    )
                )
            if opts.use_cache and (cached / package.MANIFEST).exists():
                tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
                shutil.copytree(cached, tmp, dirs_exist_ok=True)
                package.set_generation_defaults(tmp, generation)
                _install(tmp, out)
                reporter.log(f"unchanged since the cached build {key[:12]}")
                manifest = json.loads((out / package.MANIFEST).read_text())
                if manifest.get("gguf_skipped"):
                    reporter.log(f"warning: skipping the gguf target: {manifest['gguf_skipped']}")
                return BuildResult(out, manifest, meter.seconds, True, stage_peak_bytes=meter.peak_bytes)
            config = fit_context(src.family.config.from_hf(src.hf_config), opts.context_window, reporter.log)
            src.tokenizer  # noqa: B018 - convert (and so check) the tokenizer within the import stage
            if "gguf" in opts.targets:
                try:
                    gguf_export.check(src.family, config, src.tokenizer.tokenizer_json)
                except gguf_export.GGUFUnsupported as err:
                    reporter.log(f"warning: skipping the gguf target: {err}")
                    opts = dataclasses.replace(opts, targets=tuple(t for t in opts.targets if t != "gguf"), gguf_skipped=str(err))
            if opts.draft is not None:
                _check_draft(opts.draft, opts.targets, src)
            weights = src.load_weights()
            if opts.lora is not None:
                weights = merge_lora(weights, opts.lora)
            calibration = None
            if calibration_hash is not None:
                if src.family.calibration_forward is not None:
                    assert opts.calibration is not None  # calibration_hash is made from it
                    calibration = gptq.load_calibration(
                        opts.calibration, src.tokenizer.tokenizer_json, config.context_window_size
                    )
                else:
                    reporter.log(f"the {src.family.name} family has no calibration pass; rounding to nearest")

        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            reused: list[str] = []
            manifest = _build_into(
                tmp, src, name, config, weights, calibration, weights_key, spec, opts, versions, reporter, meter, reused
            )
            manifest = package.set_generation_defaults(tmp, generation)
            _store_in_cache(tmp, cached)
            _install(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return BuildResult(out, manifest, meter.seconds, False, reused, meter.peak_bytes)


def embedding_facts(config, tokenizer_json: str) -> dict:
    """The manifest's ``embedding`` record: the vector size, the pooling the library applies, whether the
    runtimes normalize its output, the longest text in tokens, the folder's prompts, and the special
    tokens around a text (the page's tokenizer adds none: the webgpu device puts these around a text)."""
    from tokenizers import Tokenizer

    from .importer import special_around

    before, after = special_around(Tokenizer.from_str(tokenizer_json))
    return {
        "dimensions": config.dimensions,
        "pooling": config.pooling,
        "normalize": config.normalize,
        "max_tokens": config.context_window_size,
        "prompts": {k: v for k, v in (("query", config.query_prompt), ("document", config.document_prompt)) if v},
        "special_tokens": {"before": before, "after": after},
    }


def _resolve_targets(targets: tuple[str, ...], family) -> tuple[str, ...]:
    """``targets``, or the family's default; the wasm library is an embedding model's only (a chat model
    runs on the browser's wasm device through its GGUF, in llama.cpp)."""
    if not targets:
        return family.default_targets
    if "wasm" in targets and family.kind != "embedding":
        raise LanternError(
            f"the wasm target is for embedding models; a {family.name} chat model runs on the browser's wasm "
            "device through its GGUF (the gguf target)"
        )
    return targets


def _resolve_quant(quant: str | None, kind: str) -> str:
    """The weight format of a build: the one asked for, else the model kind's default."""
    if quant is None:
        return DEFAULT_QUANT[kind]
    if kind == "embedding" and quant not in EMBEDDING_QUANTS:
        raise LanternError(
            f"--quant {quant}: embedding models are built {' or '.join(EMBEDDING_QUANTS)} "
            "(4-bit weights move an encoder's neighbours; the default is q0f16)"
        )
    return quant


def _store_in_cache(folder: Path, cached: Path) -> None:
    cached.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cached.parent))
    shutil.copytree(folder, staging, dirs_exist_ok=True)
    shutil.rmtree(cached, ignore_errors=True)
    staging.rename(cached)


def _build_into(
    tmp: Path,
    src: SourceModel,
    name: str,
    config,
    weights: Tensors,
    calibration: gptq.Calibration | None,
    weights_key: str,
    spec: QuantSpec,
    opts: BuildOptions,
    versions: dict,
    reporter: ProgressSink,
    meter: StageMeter,
    reused_files: list[str],
) -> dict:
    float_params = src.family.to_lantern(weights, config)  # nothing read yet: each tensor is read as it is quantized
    del weights
    n_params = sum(float_params.size(n) for n in float_params)
    quantized = config.quantized_weights() if spec.quantized else set()
    calibrated = bool(quantized) and calibration is not None
    with meter("quantize"), reporter.stage("quantize", total=len(quantized) or None):
        # Only GPTQ is worth caching; plain rounding is faster than reading the result back.
        stored = _load_cached_weights(opts, weights_key) if calibrated else None
        if stored is not None:
            reporter.advance(len(quantized), "cached")
        else:

            def gptq_all(params: Tensors = float_params):
                # the pass reads each layer's weights several times: keep about one layer's worth
                assert src.family.calibration_forward is not None and calibration is not None  # only when calibrated
                layer_cached = params.cached(gptq.LAYER_CACHE_BYTES)
                return gptq.quantize_calibrated(
                    src.family.calibration_forward,
                    layer_cached,
                    config,
                    spec,
                    calibration,
                    on_weight=lambda n: reporter.advance(1, f"GPTQ {n}"),
                )

            stored = quantize_params(
                float_params, quantized, spec, gptq_all if calibrated else None, on_weight=lambda n: reporter.advance(1, n)
            )
            if calibrated:
                _store_cached_weights(opts, weights_key, stored)
    draft_stored = None
    if opts.draft is not None and not opts.draft.endswith(".gguf"):  # this model, quantized another way
        draft_spec = get_quantization(opts.draft)
        draft_weights = config.quantized_weights() if draft_spec.quantized else set()
        with meter("draft"), reporter.stage("draft", total=len(draft_weights) or None):
            draft_stored = quantize_params(
                float_params, draft_weights, draft_spec, None, on_weight=lambda n: reporter.advance(1, n)
            )
    del float_params

    metadata = {
        "model_type": src.hf_config.get("model_type", src.family.name),
        "quantization": spec.name,
        "context_window_size": config.context_window_size,
        "sliding_window_size": -1,  # MLC's cache-level window (eviction, attention sinks): not used
        "attention_sink_size": -1,
        "prefill_chunk_size": config.prefill_chunk_size,
        "tensor_parallel_shards": 1,
        "pipeline_parallel_stages": 1,
        "kv_state_kind": "kv_cache" if src.family.kind == "chat" else "none",
        "max_batch_size": 1,
    }
    builds = _library_builds(name, spec, opts, src.family.kind)

    # A library depends on the architecture, not the weights: one built before for the same config,
    # spec, target and schedule (another fine-tune, LoRA or calibration of the model) is reused.
    executables, facts = [], {}  # facts: per library stem, its kernels, largest kernel and parameters
    contexts = {}  # per library stem, the context it runs (library_config)
    param_names: list[str] = []
    with meter("compile"), reporter.stage("compile", total=len(builds)):
        for stem, target_name, lib_spec, schedule in builds:
            file = f"{stem}.wasm" if target_name in lower.LINKED else f"{stem}.so"
            lib_config = library_config(config, lib_spec.model_dtype, schedule)
            lib_metadata = dict(
                metadata, context_window_size=lib_config.context_window_size, prefill_chunk_size=lib_config.prefill_chunk_size
            )
            contexts[stem] = lib_config.context_window_size
            key = _library_key(src, lib_config, lib_spec, target_name, schedule, lib_metadata, versions)
            hit = _cached_library(opts, key, tmp / file)
            if hit is not None:
                facts[stem], param_names = hit, hit["param_names"]
                reused_files.append(file)
                executables.append((stem, file, target_name, lib_spec, schedule, None, key))
                reporter.advance(1, f"{stem} (cached)")
                continue
            target = lower.target_for(target_name, schedule)
            exported = lower.export(src.family, lib_config, lib_spec, target, lib_metadata)
            param_names = exported.param_names
            ex, kernels, largest = lower.compile_module(
                exported.mod,
                target,
                quantized=lib_spec.quantized,
                schedule_profile=schedule or "gpu",
                encoder=src.family.kind == "embedding",
                dump_dir=opts.dump_dir / stem if opts.dump_dir else None,
                on_phase=lambda p, s=stem: reporter.advance(0, f"{s}: {p}"),  # type: ignore[misc]  # mypy#15459
            )
            facts[stem] = {"kernels": kernels, "largest": largest, "param_names": param_names}
            executables.append((stem, file, target_name, lib_spec, schedule, ex, key))
            reporter.advance(1, stem)
    missing = [n for n in param_names if n not in stored]
    if missing:
        raise LanternError(f"internal: model expects parameters the loader did not produce: {missing[:3]}")

    libraries = []
    with meter("link"), reporter.stage("link", total=len(executables)):
        for stem, file, target_name, lib_spec, schedule, ex, key in executables:
            if ex is not None and target_name in lower.LINKED:
                link.link_wasm(ex, tmp / file, opts.cache_dir, on_step=lambda d: reporter.advance(0, d))
            elif ex is not None:
                ex.export_library(str(tmp / file))
            if ex is not None:
                _store_library(opts, key, tmp / file, facts[stem])
            features = ["shader-f16"] if target_name == "webgpu" and lib_spec.needs_shader_f16 else []
            if target_name == "wasm" and schedule == lower.WASM_RELAXED:
                features, schedule = [lower.WASM_RELAXED], None  # a feature the engine needs, not a WebGPU schedule
            upcast = "float16->float32" if lib_spec.model_dtype != spec.model_dtype else None
            libraries.append(
                package.Library(
                    file,
                    target_name,
                    lib_spec.model_dtype,
                    features,
                    facts[stem]["kernels"],
                    facts[stem]["largest"],
                    upcast,
                    schedule,
                    contexts[stem],
                )
            )
            reporter.advance(1, file)

    with meter("write"), reporter.stage("write", total=3 + ("gguf" in opts.targets) + (opts.draft is not None)):
        arrays = [stored[n] for n in param_names]
        cache_index = package.write_shards(tmp, param_names, arrays)
        (tmp / "tensor-cache.json").write_text(json.dumps(cache_index, indent=1) + "\n")
        reporter.advance(1, f"{len(cache_index['records'])} shards")
        bos_id, eos_id = _write_tokenizer_and_configs(tmp, src, name, config, spec, libraries, reporter)
        reporter.advance(1, "configs")
        gguf = None
        trained = src.family.config.from_hf(src.hf_config)  # a GGUF states the model's own length
        if "gguf" in opts.targets:
            parts = gguf_export.write(
                tmp,
                f"{name}-{spec.name}",
                stored,
                src.family,
                trained,
                spec.name,
                src.tokenizer.tokenizer_json,
                src.tokenizer.chat_template,
                bos_id,
                eos_id,
                src.tokenizer.add_bos_token,
            )
            gguf = {
                "files": parts,
                "tensor_type": gguf_export.tensor_type(spec.name),
                "context_window": gguf_export.context_window(src.family, config),
                "kv_overrides": src.family.gguf.load_overrides(config),
                "bytes": sum((tmp / p).stat().st_size for p in parts),
            }
            reporter.advance(1, f"{len(parts)} GGUF part(s)")
        draft = None
        if opts.draft is not None:
            if draft_stored is not None:
                draft_files = gguf_export.write(
                    tmp,
                    f"{name}-{opts.draft}-draft",
                    draft_stored,
                    src.family,
                    trained,
                    opts.draft,
                    src.tokenizer.tokenizer_json,
                    src.tokenizer.chat_template,
                    bos_id,
                    eos_id,
                    src.tokenizer.add_bos_token,
                )
            else:
                draft_files = [f"{name}-draft.gguf"]
                shutil.copyfile(opts.draft, tmp / draft_files[0])
            draft = {
                "files": draft_files,
                "source": opts.draft if draft_stored is not None else Path(opts.draft).name,
                "bytes": sum((tmp / p).stat().st_size for p in draft_files),
            }
            reporter.advance(1, "draft GGUF")
        weight_bytes = cache_index["metadata"]["ParamBytes"]
        manifest = {
            "format": "lantern-artifact",
            "manifest_version": package.MANIFEST_VERSION,
            "model": {
                "name": name,
                "family": src.family.name,
                "architecture": (src.hf_config.get("architectures") or ["?"])[0],
                "parameters": n_params,
                "context_window": config.context_window_size,
                "prefill_chunk_size": config.prefill_chunk_size,
                "vocab_size": config.vocab_size,
                # the <think>…</think> tags both runtimes return as reasoning_content, or null
                "reasoning_tags": chat_template.reasoning_tags(src.tokenizer.chat_template),
                "kind": src.family.kind,  # "chat", or "embedding" (see "embedding")
            },
            # an embedding model's vectors: what the runtimes do after the library's pooled output
            "embedding": embedding_facts(config, src.tokenizer.tokenizer_json) if src.family.kind == "embedding" else None,
            "quantization": spec.name,
            "calibration": calibration.manifest() if calibrated and calibration is not None else None,
            "source": {
                "input": Path(opts.source).name,
                "sha256": src.source_hash,
                "lora_sha256": adapter_hash(opts.lora) if opts.lora else None,
            },
            "targets": sorted(set(opts.targets)),
            "libraries": [dataclasses.asdict(lib) for lib in libraries],
            # llama.cpp's copy of the same weights (the wasm device, the llamacpp engine), or null
            "gguf": gguf,
            "gguf_skipped": opts.gguf_skipped,  # why a requested gguf target was not written
            # a draft model for the llamacpp engine's speculation (`--draft`), or null
            "draft": draft,
            # The artifact runs where at least one WebGPU library's features are present.
            "required_features": min((lib.required_features for lib in libraries if lib.target == "webgpu"), key=len, default=[]),
            "weights": {"bytes": weight_bytes, "bytes_per_param": weight_bytes / n_params, "shards": len(cache_index["records"])},
            "memory": {
                "estimated_gpu_bytes": package.estimate_gpu_bytes(
                    weight_bytes, config, spec.model_dtype, config.context_window_size
                )
            },
            "versions": versions,
        }
        package.write_readme(tmp, manifest)
        files = [p.name for p in tmp.iterdir()] + [package.MANIFEST, "package.json"]
        package.write_package_json(tmp, name, spec.name, versions["lantern"], sorted(set(files)))
        manifest = package.write_manifest(tmp, manifest)
        reporter.advance(1, "manifest")
    return manifest


def _library_builds(
    name: str, spec: QuantSpec, opts: BuildOptions, kind: str = "chat"
) -> list[tuple[str, str, QuantSpec, str | None]]:
    """(file stem, target, spec, variant) of every library to build; the variant is a webgpu library's
    schedule, or lower.WASM_RELAXED for the wasm target's relaxed-SIMD twin. The "gpu" schedule
    computes in the weights' dtype, plus an f32 twin for adapters without shader-f16; the
    "cpu-emulated" one computes in f32 only (software adapters have no shader-f16). An embedding
    model's CPU and wasm libraries compute in f32 too (its float16 weights are upcast at load)."""
    builds: list[tuple[str, str, QuantSpec, str | None]] = []
    for target in opts.targets:
        if target == "gguf":
            continue  # not a library: written from the stored weights (gguf_export)
        if target != "webgpu":
            own = _fallback_spec(spec) if kind == "embedding" else spec
            builds.append((f"{name}-{spec.name}-{target}", target, own, None))
            if target == "wasm":
                builds.append((f"{name}-{spec.name}-wasm-relaxed", target, own, lower.WASM_RELAXED))
            continue
        for schedule in lower.schedules(opts.webgpu_schedule):
            if schedule == "cpu-emulated":
                builds.append((f"{name}-{spec.name}-webgpu-emulated", target, _fallback_spec(spec), schedule))
                continue
            builds.append((f"{name}-{spec.name}-webgpu", target, spec, schedule))
            if spec.needs_shader_f16:
                builds.append((f"{name}-{spec.name}-webgpu-f32", target, _fallback_spec(spec), schedule))
    return builds


def _write_tokenizer_and_configs(
    tmp: Path, src: SourceModel, name: str, config, spec: QuantSpec, libraries: list[package.Library], reporter: ProgressSink
) -> tuple[int | None, int | None]:
    tok = src.tokenizer
    tokenizer_json = json.loads(tok.tokenizer_json)
    if tokenizer_json.get("padding") or tokenizer_json.get("truncation"):
        # a text's length is the runtimes' business (refused, or cut when a request asks): sentence-transformers
        # exports pad and cut every text to 128 tokens, which the page's tokenizer would do too
        (tmp / "tokenizer.json").write_text(json.dumps({**tokenizer_json, "padding": None, "truncation": None}))
    else:
        (tmp / "tokenizer.json").write_text(tok.tokenizer_json)
    (tmp / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": tok.chat_template,
                "bos_token": tok.bos_token,
                "eos_token": tok.eos_token,
                "add_bos_token": tok.add_bos_token,
            },
            indent=2,
        )
        + "\n"
    )
    vocab = json.loads(tok.tokenizer_json)
    added = {t["content"]: t["id"] for t in vocab.get("added_tokens", [])}
    model_vocab = vocab.get("model", {}).get("vocab", {})
    token_id = lambda t: added.get(t, model_vocab.get(t) if isinstance(model_vocab, dict) else None)  # noqa: E731
    eos_id, bos_id = token_id(tok.eos_token), token_id(tok.bos_token)
    conv = None
    if tok.chat_template:
        try:
            conv = chat_template.to_conv_template(
                tok.chat_template,
                bos_token=tok.bos_token or "",
                eos_token=tok.eos_token or "",
                stop_token_ids=[eos_id] if eos_id is not None else [],
                name=name,
                bos_token_id=bos_id,
            )
        except LanternError as err:
            # Lantern's runtime renders the Jinja template itself; only WebLLM loses the chat format.
            reporter.log(f"warning: no WebLLM conv_template: {err}")
        if conv is not None and tok.add_bos_token and bos_id is not None:
            conv["system_prefix_token_ids"] = [bos_id]  # the tokenizer adds one (the template's, if any, is moved there)
    webgpu = [lib for lib in libraries if lib.target == "webgpu"]
    # WebLLM takes its context from here, for whichever library its user loads: the least of them
    # (Lantern's runtime reads each library's own _metadata instead)
    # each library this build makes states its context (_build_into), so none is None here
    context = min((cast(int, lib.context_window) for lib in webgpu), default=config.context_window_size)
    chat_config = {
        "version": "0.1.0",
        "model_type": src.hf_config.get("model_type", src.family.name),
        "quantization": spec.name,
        "model_config": dataclasses.asdict(config),
        "vocab_size": config.vocab_size,
        "context_window_size": context,
        "sliding_window_size": -1,  # MLC's cache-level window (eviction, attention sinks): not used
        "prefill_chunk_size": min(config.prefill_chunk_size, context),
        "attention_sink_size": -1,
        "tensor_parallel_shards": 1,
        # sampling: OpenAI's defaults here; build() writes the artifact's own (set_generation_defaults)
        **package.webllm_generation({}),
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "tokenizer_files": ["tokenizer.json"],
        "tokenizer_info": {
            "token_postproc_method": _token_postproc(vocab),
            "prepend_space_in_encode": False,
            "strip_space_in_decode": False,
        },
        "conv_template": conv,
        "pad_token_id": 0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        # Not read by WebLLM (its ModelRecord names the library); recorded for tools.
        "model_lib": next(
            (lib.file for lib in webgpu if lib.schedule == "gpu" and not lib.param_upcast), webgpu[0].file if webgpu else None
        ),
    }
    (tmp / "mlc-chat-config.json").write_text(json.dumps(chat_config, indent=2) + "\n")
    return bos_id, eos_id


def _token_postproc(tokenizer: dict) -> str:
    """How WebLLM's grammar engine maps token strings to bytes."""
    decoder = tokenizer.get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
    return "byte_level" if "ByteLevel" in kinds else "byte_fallback"
