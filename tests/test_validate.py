"""`lantern validate` end to end: the real CLI, headless Chromium, the real runtime."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from lantern.runtime.artifact import Artifact

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build, pytest.mark.slow]

# small enough to keep each run near a minute on SwiftShader
QUICK = ["--max-tokens", "6", "--ppl-tokens", "32"]


@pytest.fixture(scope="module")
def smollm2(smollm2_q4) -> Artifact:
    return smollm2_q4


@pytest.fixture(scope="module")
def tiny(tiny_hf, tiny_q4, build_artifact) -> Artifact:
    """For the failing cases: a breach is found the same way on any model, and the tiny one loads in seconds.
    tiny_q4 with only the WebGPU library SwiftShader runs (its libraries and weights come from
    tiny_q4's build, in seconds): each run compiles half the pipelines."""
    return Artifact.open(build_artifact(tiny_hf[0], "q4f32_1", targets=("webgpu", "cpu"), webgpu_schedule="cpu-emulated"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("validate") / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "The capital of France is"}) + "\n")
    return path


def validate(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lantern.cli", "validate", *map(str, args)], capture_output=True, text=True, env=env, timeout=1200
    )


def copy_artifact(art: Artifact, dst):
    shutil.copytree(art.path, dst)
    return dst


def rehash(folder) -> None:
    """Regenerate lantern.json's hashes after editing files (a retrained checkpoint looks like this)."""
    manifest = json.loads((folder / "lantern.json").read_text())
    for name in manifest["files"]:
        data = (folder / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (folder / "lantern.json").write_text(json.dumps(manifest, indent=1))


@pytest.fixture(scope="module")
def healthy_report(smollm2, prompts, cache_dir, request):
    """ci/validate.sh, the plain-shell job users copy into their CI: `lantern build smollm2` (a cache
    hit after smollm2_q4: the same inputs), then `lantern validate` against ci/budget.toml."""
    root = request.config.rootpath
    env = {
        **os.environ,
        "LANTERN": str(Path(sys.executable).with_name("lantern")),
        "LANTERN_CACHE": str(cache_dir),
        "VALIDATE_ARGS": " ".join(["--prompts", str(prompts), *QUICK]),
    }
    run = subprocess.run(["bash", str(root / "ci" / "validate.sh")], capture_output=True, text=True, env=env, timeout=1800)
    return run, root / "test-output"


def test_a_healthy_artifact_passes(healthy_report, report):
    run, out = healthy_report
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads((out / "validate.json").read_text())
    assert data["passed"] is True
    m = data["metrics"]
    assert m["cpu_token_match"] == 1.0 and m["logit_error"] < 1e-3
    assert m["peak_gpu_bytes"] >= m["weight_bytes"]
    assert all(p["ok"] for p in data["pipelines"] if p["checked"])
    # structured output: every greedy answer under the bundled schemas validated in the page
    assert m["structured_valid"] == 1.0 and len(data["structured"]) == 3
    assert all(json.loads(r["text"]) is not None and r["problem"] is None for r in data["structured"])
    assert any(c["name"] == "correctness.min_structured_valid" and c["status"] == "pass" for c in data["checks"])
    suite = ET.parse(out / "validate.xml").getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests")) == len(data["checks"])
    report(
        f"validate (SmolLM2 q4f32_1, SwiftShader): load cold {m['load_s_cold']:.1f} s, cached "
        f"{m['load_s_cached']:.1f} s, decode {m['decode_tokens_per_s']:.2f} tok/s, perplexity "
        f"{m['perplexity']:.1f} (CPU {m['cpu_perplexity']:.1f}), peak GPU {m['peak_gpu_bytes'] / 2**20:.0f} MiB"
    )


# Correctness limits that hold for any model, random weights included (ci/budget.toml's perplexity
# ceiling is SmolLM2's).
TINY_BUDGET = """[correctness]
min_cpu_token_match = 1.0
max_logit_error = 1e-3
max_perplexity_gap_pct = 1.0
max_perplexity_increase_pct = 5.0
min_baseline_token_match = 0.9
"""


@pytest.fixture(scope="module")
def tiny_baseline(tiny, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-baseline")
    (out / "budget.toml").write_text(TINY_BUDGET)
    run = validate(tiny.path, "--budget", out / "budget.toml", "--prompts", prompts, *QUICK, "--json", out / "report.json")
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def test_perturbed_weights_and_an_impossible_speed_floor_fail_naming_each_metric(tiny, prompts, tiny_baseline, tmp_path):
    """A retrained checkpoint gone wrong: every quantized weight matrix has noise in a fifth of its bytes
    (the scales are left alone, so nothing overflows). The browser still matches the CPU library; the
    baseline comparison catches it. The same run has a decode floor no device reaches: each breach is
    named by its metric, and nothing else is (one validation run for both, as each costs ~40 s)."""
    folder = copy_artifact(tiny, tmp_path / "perturbed")
    rng = np.random.default_rng(0)
    index = json.loads((folder / "tensor-cache.json").read_text())
    for shard in index["records"]:
        data = np.frombuffer((folder / shard["dataPath"]).read_bytes(), dtype=np.uint8).copy()
        for rec in shard["records"]:
            if rec["name"].endswith("q_weight"):
                part = data[rec["byteOffset"] : rec["byteOffset"] + rec["nbytes"]]
                hit = rng.random(len(part)) < 0.2
                part[hit] ^= rng.integers(1, 256, hit.sum(), dtype=np.uint8)
        (folder / shard["dataPath"]).write_bytes(data.tobytes())
    rehash(folder)
    budget = tmp_path / "budget.toml"
    budget.write_text((tiny_baseline / "budget.toml").read_text() + "\n[speed]\nmin_decode_tokens_per_s = 1e9\n")
    run = validate(folder, "--budget", budget, "--prompts", prompts, *QUICK, "--baseline", tiny_baseline / "report.json")
    assert run.returncode == 1, run.stderr[-3000:]
    breached = run.stderr.split("budget breached:")[1].splitlines()[0]
    assert "correctness." in breached and "speed.min_decode_tokens_per_s" in breached
    assert re.findall(r"speed\.\w+", breached) == ["speed.min_decode_tokens_per_s"]


def test_a_corrupted_shard_cannot_run_and_names_the_file(tiny, tmp_path):
    folder = copy_artifact(tiny, tmp_path / "corrupt")
    shard = folder / "params_shard_0.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    run = validate(folder)
    assert run.returncode == 2
    assert "params_shard_0.bin" in run.stderr


def test_firefox_and_webkit_validate_the_gguf_and_a_corrupt_part_cannot_run(smollm2, prompts, tmp_path):
    """--browser firefox,webkit: neither has WebGPU here, so each runs the GGUF on the wasm device (the
    default and the compat build of llama.cpp) against ci/budget.toml's correctness and size limits;
    checks are named per browser, and what the wasm device cannot measure (logits, perplexity) is
    not-checked, never a pass."""
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "report.json"
    # ci/budget.toml without its speed floors: beside the suite's other browsers on 2 cores, WebKit once
    # decoded 0.13 tok/s (under the 0.3 floor) on the 4 threads an earlier thread probe chose, and any
    # llama.cpp thread count stalls when the cores are busy; speed is the benchmarks' to judge
    # (ci/bench/bench_browsers.py), and test_perturbed_weights_and_an_impossible_speed_floor_fail_naming_each_metric covers the check
    budget = tmp_path / "budget.toml"
    budget.write_text(re.sub(r"\n\[speed\].*?(?=\n\[)", "\n", (root / "ci" / "budget.toml").read_text(), flags=re.S))
    # one llama.cpp thread each: the suite runs a test file per core (see test_wasm_device.py's session)
    run = validate(
        smollm2.path,
        "--browser",
        "firefox,webkit",
        "--budget",
        budget,
        "--prompts",
        prompts,
        *QUICK,
        "--threads",
        "1",
        "--json",
        out,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    for name in ("firefox", "webkit"):
        m = data["metrics"]["browsers"][name]
        assert m["device"].startswith("CPU (wasm"), m
        assert m["cpu_token_match"] == 1.0 and m["structured_valid"] == 1.0, m
        checks = {c["name"]: c["status"] for c in data["checks"] if c["name"].startswith(f"{name}:")}
        assert checks[f"{name}:correctness.min_cpu_token_match"] == "pass"
        assert checks[f"{name}:correctness.max_logit_error"] == "not-checked"
    folder = copy_artifact(smollm2, tmp_path / "corrupt")
    part = folder / smollm2.manifest["gguf"]["files"][-1]
    data = bytearray(part.read_bytes())
    data[-10] ^= 1
    part.write_bytes(bytes(data))
    # the artifact is checked against its manifest before any browser starts, as for Chromium
    run = validate(folder, "--browser", "firefox,webkit", "--prompts", prompts, *QUICK)
    assert run.returncode == 2 and part.name in run.stderr, run.stderr[-2000:]


def test_missing_chromium_is_a_clear_message(tiny, tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing on PATH: no chromium
    run = validate(tiny.path, "--max-tokens", "1", env=env)
    assert run.returncode == 2
    assert "no Chromium found" in run.stderr


def test_bad_budget_and_prompts_are_refused_before_running(tiny, tmp_path):
    budget = tmp_path / "b.toml"
    budget.write_text("[speed]\nmin_decode_tok = 1\n")
    run = validate(tiny.path, "--budget", budget)
    assert run.returncode == 2 and "unknown keys speed.min_decode_tok" in run.stderr
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "x"}\n')
    run = validate(tiny.path, "--prompts", prompts)
    assert run.returncode == 2 and "p.jsonl:1" in run.stderr
