"""Sampling defaults travel with the artifact: `lantern build` reads generation_config.json, its flags
override the file, and both runtimes take each field from the request, else the artifact, else OpenAI.
The build also shows its progress as plain lines when its output is a pipe (a CI log)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai import OpenAI
from pydantic import ValidationError

from browser import lantern_server, wait_until_ready
from test_structured import run_typescript

from lantern.runtime.artifact import Artifact
from lantern.package import GENERATION_FIELDS
from lantern.server.engine import InvalidRequest, sampling_params
from lantern.server.protocol import ChatCompletionRequest

VOCAB = 1000
SMOL = {"temperature": 0.2, "top_p": 0.9}  # an artifact's defaults
# (request fields, artifact defaults): what each runtime resolves, or an error from both
CASES = [
    ({}, {}),  # OpenAI's defaults
    ({}, SMOL),  # the artifact's
    ({"temperature": 0.7}, SMOL),  # the request wins field by field
    ({"temperature": None, "top_p": None}, SMOL),  # null means "not set"
    (
        {"temperature": 0, "top_p": 1, "top_k": 5, "repetition_penalty": 1.3},
        {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.1},
    ),
    ({}, {"top_k": 40, "repetition_penalty": 1.1}),
    ({"top_k": 5000}, {}),  # more than the vocabulary: all of it
    ({"temperature": 2.5}, SMOL),
    ({"top_p": 1.5}, {}),
    ({"top_k": 2.5}, {}),
    ({"repetition_penalty": 0.001}, {}),
    # DRY: off for free text; under a JSON response_format, schema_defaults.dryMultiplier unless the request sets one
    ({"response_format": {"type": "json_object"}}, {}),  # schema_defaults' own default: 0.8
    (
        {
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
            "schema_defaults": {"dryMultiplier": 0.3},
            "dry_base": 2,
            "dry_allowed_length": 3,
            "dry_penalty_last_n": 64,
        },
        {},
    ),
    ({"response_format": {"type": "json_object"}, "dry_multiplier": 0}, {}),
    ({"dry_multiplier": 1.5}, {}),
    ({"response_format": {"type": "text"}}, {}),
    ({"dry_base": 0.5}, {}),
]
DRY = {
    0: [0, 1.75, 2, -1],
    11: [0.8, 1.75, 2, -1],
    12: [0.3, 2, 3, 64],
    13: [0, 1.75, 2, -1],
    14: [1.5, 1.75, 2, -1],
    15: [0, 1.75, 2, -1],
}  # case -> [multiplier, base, allowed length, last n]


def python_params(request: dict, defaults: dict) -> dict:
    try:
        req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **request})
        p = sampling_params(req, VOCAB, defaults)
    except (ValidationError, InvalidRequest) as err:
        return {"error": str(err)}
    return {
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "repetition_penalty": p.repetition_penalty,
        "dry": [p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n],
    }


@pytest.fixture(scope="module")
def typescript():
    return run_typescript("generation_defaults.ts", {"vocab": VOCAB, "cases": [{"request": r, "defaults": d} for r, d in CASES]})


def test_both_runtimes_share_one_table_of_fields_openai_defaults_and_ranges(typescript):
    assert typescript["fields"] == {name: list(v) for name, v in GENERATION_FIELDS.items()}


@pytest.mark.parametrize("i", range(len(CASES)))
def test_request_then_artifact_then_openai_in_both_runtimes(i, typescript):
    request, defaults = CASES[i]
    ts, py = typescript["params"][i], python_params(request, defaults)
    if "error" in py:
        assert "error" in ts, (request, ts)
        return
    assert ts == py
    if i in DRY:
        assert py["dry"] == DRY[i]
    for name, (openai, _, _) in GENERATION_FIELDS.items():
        want = request.get(name)
        want = defaults.get(name, openai) if want is None else want
        assert py[name] == (min(want, VOCAB) if name == "top_k" else want)


def _build(source: Path, out: Path, cache: Path, *flags: str) -> subprocess.Popen:
    """`lantern build` (CPU library only) with stdout and stderr piped, as in a CI log."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lantern.cli",
            "build",
            str(source),
            "--out",
            str(out),
            "--targets",
            "cpu",
            "--no-calibration",
            "--cache-dir",
            str(cache),
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_build_reads_generation_config_flags_override_it_and_a_pipe_sees_each_stage_live(tiny_hf, tmp_path, report):
    source = tmp_path / "tiny-finetune"
    shutil.copytree(tiny_hf[0], source)
    (source / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": 2})
    )
    out, cache = tmp_path / "art", tmp_path / "cache"  # an empty cache: the build compiles

    proc = _build(source, out, cache)
    lines = []  # (line, was the build still running when it arrived)
    for line in proc.stdout:
        lines.append((line.rstrip(), proc.poll() is None))
    assert proc.wait() == 0, "\n".join(text for text, _ in lines)
    live = [text for text, running in lines if running]
    for stage in ("import", "quantize", "compile", "link", "write"):
        assert f"lantern build: {stage} started" in live
        assert any(text.startswith(f"lantern build: {stage} done in ") for text, _ in lines)
    report(f"lantern build into a pipe: {len(live)} progress lines before it ended, e.g. '{live[0]}'")

    art = Artifact.open(out)  # hashes verified
    assert art.manifest["generation"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    chat = json.loads((out / "mlc-chat-config.json").read_text())  # what WebLLM reads
    assert (chat["temperature"], chat["top_p"], chat["repetition_penalty"]) == (0.6, 0.95, 1.0)

    # Flags override the file, and change no weights or kernels: the cached build is reused.
    started = time.perf_counter()
    proc = _build(source, out, cache, "--temperature", "0", "--repetition-penalty", "1.2")
    log = proc.communicate()[0]
    assert proc.returncode == 0, log
    assert "unchanged since the cached build" in log
    report(f"lantern build with new sampling flags (cache hit): {time.perf_counter() - started:.1f} s")
    art = Artifact.open(out)
    assert art.manifest["generation"] == {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.2}
    chat = json.loads((out / "mlc-chat-config.json").read_text())
    assert (chat["temperature"], chat["repetition_penalty"]) == (0.0, 1.2)

    # The server applies the artifact's temperature 0 to requests that set none: any seed, one answer,
    # the same as a request that asks for temperature 0.
    with lantern_server([out]) as (base, _):
        wait_until_ready(base)
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

        def answer(**fields) -> str:
            reply = client.chat.completions.create(
                model="art", messages=[{"role": "user", "content": "Hello"}], max_tokens=12, **fields
            )
            return reply.choices[0].message.content

        assert answer(seed=1) == answer(seed=2) == answer(temperature=0)


def test_bad_sampling_defaults_are_refused_and_leave_the_artifact_alone(tiny_hf, tmp_path):
    source = tmp_path / "tiny-finetune"
    shutil.copytree(tiny_hf[0], source)
    out = tmp_path / "art"
    (source / "generation_config.json").write_text(json.dumps({"temperature": 7}))
    proc = _build(source, out, tmp_path / "cache")
    log = proc.communicate()[0]
    assert proc.returncode == 1
    assert "generation_config.json: temperature must be in [0, 2], got 7" in log
    assert not out.exists()

    proc = _build(source, out, tmp_path / "cache", "--top-p", "1.5")  # a flag is checked before anything runs
    log = proc.communicate()[0]
    assert proc.returncode == 2 and "argument --top-p: top_p must be in [0, 1], got 1.5" in log
