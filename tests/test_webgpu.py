"""The WebGPU library in headless Chromium (SwiftShader) against the CPU library of the same build."""

import numpy as np
import pytest

from browser import chromium, repo_root, serve

from lantern.artifact import Artifact

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build]

TVMJS = repo_root() / "webruntime" / "node_modules" / "@mlc-ai" / "web-runtime" / "lib"


def probe(art: Artifact, steps: list[list[int]]) -> list[np.ndarray]:
    """Run the steps (prefill or decode each) on WebGPU; return each step's last logits."""
    lib = next(lib["file"] for lib in art.manifest["libraries"]
               if lib["target"] == "webgpu" and not lib["required_features"])
    routes = {"/tvmjs/": TVMJS, "/probe/": repo_root() / "tests" / "web", "/models/m/": art.path}
    with serve(routes) as base, chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/probe/model_probe.html")
        result = page.evaluate("([u, l, s]) => runProbe(u, l, s.map(t => ({tokens: t})))",
                               [base + "/models/m/", lib, steps])
    return [np.array(x, dtype=np.float32) for x in result["logits"]]


def multi_turn_steps(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    draw = lambda n: [int(t) for t in rng.integers(0, 49152, n)]  # noqa: E731
    # first prefill, two decodes, then a second prefill on top of the history (a new chat turn)
    return [draw(21), draw(1), draw(1), draw(13)]


def check_against_cpu(art: Artifact, steps, rtol: float) -> None:
    cpu = art.cpu_model()
    expected = [cpu.prefill(s) for s in steps]
    got = probe(art, steps)
    for i, (e, g) in enumerate(zip(expected, got)):
        err = np.abs(e - g).max() / np.abs(e).max()
        assert err < rtol, f"step {i} ({len(steps[i])} tokens): relative logit error {err:.2e}"


def test_tiny_model_webgpu_matches_cpu(tiny_hf, build_artifact):
    art = Artifact.open(build_artifact(tiny_hf[0], "q4f32_1", targets=("webgpu", "cpu")))
    check_against_cpu(art, multi_turn_steps(0), rtol=1e-4)


@pytest.mark.slow
def test_smollm2_q4f32_webgpu_matches_cpu(build_artifact):
    art = Artifact.open(build_artifact("smollm2", "q4f32_1", targets=("webgpu", "cpu")))
    check_against_cpu(art, multi_turn_steps(1), rtol=1e-3)
