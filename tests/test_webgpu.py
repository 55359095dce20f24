"""The WebGPU library in headless Chromium (SwiftShader) against the CPU library of the same build."""

import numpy as np
import pytest

from browser import check_against_cpu, multi_turn_steps, probe

from lantern.runtime.artifact import Artifact

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build]


@pytest.mark.parametrize("emulated", [False, True], ids=["gpu", "cpu-emulated"])
def test_tiny_model_webgpu_matches_cpu(emulated, tiny_q4, report):
    """Both schedules of the default build: prefill, decodes, then a prefill on top of the history."""
    art = tiny_q4
    check_against_cpu(art, multi_turn_steps(0), rtol=1e-4, report=report, lib=art.library("webgpu", emulated=emulated).name)


@pytest.mark.slow
def test_smollm2_q4f32_webgpu_matches_cpu(smollm2_q4, report):
    """Real weights on the library SwiftShader runs (the tiny model covers the other schedule)."""
    check_against_cpu(
        smollm2_q4, multi_turn_steps(1), rtol=1e-3, report=report, lib=smollm2_q4.library("webgpu", emulated=True).name
    )


def test_f16_artifact_has_a_fallback_that_runs_without_shader_f16(tiny_hf, build_artifact):
    """q4f16_1: the f16 library needs shader-f16 (SwiftShader lacks it); an f32 library runs here on
    the same f16 weights, upcast at load, and matches numpy on the dequantized weights. A real GPU
    without shader-f16 gets the gpu schedule's f32 twin, a software adapter the cpu-emulated library.
    The browser runs the cpu-emulated one: the twin's kernels are q4f32_1's gpu schedule, which
    test_tiny_model_webgpu_matches_cpu[gpu] runs, and both take the weights through the same upcast."""
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
    for lib in fallbacks[1:]:
        got_logits = probe(art, tokens, lib=lib, upcast=True)
        for i, (end, got) in enumerate(zip(ends, got_logits)):
            err = np.abs(got - ref[end]).max() / np.abs(ref[end]).max()
            assert err < 1e-4, f"{lib}, step {i}: relative logit error {err:.2e}"
