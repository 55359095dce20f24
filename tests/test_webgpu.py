"""The WebGPU library in headless Chromium (SwiftShader) against the CPU library of the same build."""

import numpy as np
import pytest

from browser import probe_page

from lantern.artifact import Artifact

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build]


def probe(art: Artifact, steps: list[list[int]], lib: str | None = None, upcast: bool = False) -> list[np.ndarray]:
    """Run the steps (prefill or decode each) on WebGPU; return each step's last logits.

    ``lib`` defaults to the library a device without optional features runs; ``upcast`` loads float16
    weights as float32 (what a runtime does for an f16 artifact's fallback library).
    """
    lib = lib or art.library("webgpu").name
    with probe_page(art.path) as (page, model_url):
        result = page.evaluate("([u, l, s, up]) => runProbe(u, l, s.map(t => ({tokens: t})), up)",
                               [model_url, lib, steps, upcast])
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


@pytest.mark.parametrize("emulated", [False, True], ids=["gpu", "cpu-emulated"])
def test_tiny_model_webgpu_matches_cpu(emulated, tiny_q4, report):
    """Both schedules of the default build: prefill, decodes, then a prefill on top of the history."""
    art = tiny_q4
    check_against_cpu(art, multi_turn_steps(0), rtol=1e-4, report=report,
                      lib=art.library("webgpu", emulated=emulated).name)


@pytest.mark.slow
def test_smollm2_q4f32_webgpu_matches_cpu(smollm2_q4, report):
    """Real weights on the library SwiftShader runs (the tiny model covers the other schedule)."""
    check_against_cpu(smollm2_q4, multi_turn_steps(1), rtol=1e-3, report=report,
                      lib=smollm2_q4.library("webgpu", emulated=True).name)


def test_f16_artifact_has_a_fallback_that_runs_without_shader_f16(tiny_hf, build_artifact):
    """q4f16_1: the f16 library needs shader-f16 (SwiftShader lacks it); the f32 libraries run here on
    the same f16 weights, upcast at load, and match numpy on the dequantized weights. A real GPU without
    shader-f16 gets the gpu schedule's f32 twin, a software adapter the cpu-emulated library."""
    import numpy_llama
    from reference_weights import hf_weights_from_artifact

    folder, _, cfg = tiny_hf
    art = Artifact.open(build_artifact(folder, "q4f16_1", targets=("webgpu", "cpu")))
    libs = {lib["file"]: lib for lib in art.manifest["libraries"] if lib["target"] == "webgpu"}
    assert sorted(lib["required_features"] for lib in libs.values()) == [[], [], ["shader-f16"]]
    assert art.manifest["required_features"] == []
    fallbacks = [art.library("webgpu").name, art.library("webgpu", emulated=True).name]
    assert [libs[f]["schedule"] for f in fallbacks] == ["gpu", "cpu-emulated"]
    for f in fallbacks:
        assert libs[f]["param_upcast"] == "float16->float32" and libs[f]["dtype"] == "float32"
    f16_lib = art.library("webgpu", frozenset({"shader-f16"})).name
    assert libs[f16_lib]["required_features"] == ["shader-f16"]
    assert "enable f16;" in (art.path / f16_lib).read_bytes().decode("latin-1")

    tokens = multi_turn_steps(2)
    weights = hf_weights_from_artifact(art.params(), cfg, "q4f16_1")
    flat = [t for step in tokens for t in step]
    ref = numpy_llama.forward(weights, cfg, flat)
    ends = np.cumsum([len(s) for s in tokens]) - 1
    for lib in fallbacks:
        got_logits = probe(art, tokens, lib=lib, upcast=True)
        for i, (end, got) in enumerate(zip(ends, got_logits)):
            err = np.abs(got - ref[end]).max() / np.abs(ref[end]).max()
            assert err < 1e-4, f"{lib}, step {i}: relative logit error {err:.2e}"
