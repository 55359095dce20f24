"""The compiled CPU library of a tiny random Llama against the numpy reference model."""

import numpy as np
import pytest

import numpy_llama
from reference_weights import hf_weights_from_artifact

from lantern.runtime.artifact import Artifact


@pytest.fixture(scope="module")
def tokens():
    return [int(t) for t in np.random.default_rng(7).integers(0, 49152, 70)]


@pytest.mark.parametrize("quant", ["q0f32", "q4f32_1"])
def test_all_position_logits_match_numpy(tiny_hf, build_artifact, tokens, quant):
    folder, weights, cfg = tiny_hf
    art = Artifact.open(build_artifact(folder, quant))
    ref_weights = weights if quant == "q0f32" else hf_weights_from_artifact(art.params(), cfg, quant)
    ref = numpy_llama.forward(ref_weights, cfg, tokens)
    got = art.cpu_model().all_logits(tokens)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_prefill_on_history_and_decode_match_numpy(tiny_hf, build_artifact, tokens):
    folder, weights, cfg = tiny_hf
    model = Artifact.open(build_artifact(folder, "q0f32")).cpu_model()
    ref = numpy_llama.forward(weights, cfg, tokens)
    scale = np.abs(ref).max()
    # first prefill, two decodes, then a second prefill on top of that history
    cuts = [(0, 40), (40, 41), (41, 42), (42, 70)]
    for start, end in cuts:
        got = model.prefill(tokens[start:end])
        np.testing.assert_allclose(got, ref[end - 1], atol=1e-4 * scale)


def test_greedy_matches_numpy(tiny_hf, build_artifact, tokens):
    folder, weights, cfg = tiny_hf
    model = Artifact.open(build_artifact(folder, "q0f32")).cpu_model()
    assert model.greedy(tokens[:12], 8) == numpy_llama.greedy(weights, cfg, tokens[:12], 8)


def test_prefill_reusing_the_cache_keeps_only_the_shared_prefix(tiny_hf, build_artifact, tokens):
    """What the server does between requests: a repeated prompt, one that diverges mid-way, one with
    nothing in common; each must give the logits of the whole prompt from scratch (numpy)."""
    folder, weights, cfg = tiny_hf
    model = Artifact.open(build_artifact(folder, "q0f32")).cpu_model()
    model.prefill(tokens[:30])
    model.prefill(tokens[60:64])  # tokens generated after that prompt
    cases = [(tokens[:30], 29), (tokens[:20] + tokens[40:50], 20), (tokens[50:60], 0)]
    for prompt, reused in cases:
        logits, got_reused = model.prefill_reusing(prompt)
        ref = numpy_llama.forward(weights, cfg, prompt)[-1]
        assert got_reused == reused and model.tokens == prompt
        np.testing.assert_allclose(logits, ref, atol=1e-4 * np.abs(ref).max())


def test_a_prompt_asked_again_gets_the_same_logits_bit_for_bit(tiny_hf, build_artifact, tokens):
    """Repeatability (issue 49): the same prompt again, its answer's tokens dropped from the cache, gets the
    same bits. TVM computes a chunk's row otherwise than a decode step's (TVM's paged KV cache merges a
    chunk's attention with the cached part's), so the prompt's last token always runs as a step: on a
    cache hit that is the one token run, as it was the first time."""
    folder, _, _ = tiny_hf
    model = Artifact.open(build_artifact(folder, "q0f32")).cpu_model()
    prompt = tokens[:30]
    first, reused = model.prefill_reusing(prompt)
    assert reused == 0
    model.prefill(tokens[60:64])  # the answer's tokens
    again, reused = model.prefill_reusing(prompt)
    assert reused == 29 and np.array_equal(again, first)


def test_conversations_stay_cached_side_by_side_within_one_window(tiny_hf, build_artifact):
    """The server's tvm engine keeps several conversations: a next turn of each reuses its own
    prefix, a new one takes the least recently used sequence, and together they never hold more
    than one context window of KV pages (the older ones give theirs up)."""
    folder, weights, cfg = tiny_hf
    art = Artifact.open(build_artifact(folder, "q0f32"))
    window = art.manifest["model"]["context_window"]
    model = art.cpu_model(conversations=3)
    rng = np.random.default_rng(3)
    a, b, c = ([int(t) for t in rng.integers(0, 49152, n)] for n in (40, 30, 20))
    for prompt, reused in [(a, 0), (b, 0), (a + c[:5], 40), (b + c[:7], 30), (c, 0), (a + c[:5] + c, 45)]:
        logits, got = model.prefill_reusing(prompt)
        ref = numpy_llama.forward(weights, cfg, prompt)[-1]
        assert got == reused, prompt[:3]
        np.testing.assert_allclose(logits, ref, atol=1e-4 * np.abs(ref).max())
    # a fourth conversation evicts the least recently used (b's)
    d = [int(t) for t in rng.integers(0, 49152, 10)]
    assert model.prefill_reusing(d)[1] == 0
    assert model.prefill_reusing(b + c[:7] + d)[1] == 0
    # a long one takes every page: the others are dropped, and it still fits
    long = [int(t) for t in rng.integers(0, 49152, window - 8)]
    logits, _ = model.prefill_reusing(long)
    assert all(not t for s, t in model.cached.items() if s != model.seq_id)
    ref = numpy_llama.forward(weights, cfg, long)[-1]
    np.testing.assert_allclose(logits, ref, atol=1e-4 * np.abs(ref).max())


def test_q0f16_runs_close_to_f32(tiny_hf, build_artifact, tokens):
    folder, weights, cfg = tiny_hf
    got = Artifact.open(build_artifact(folder, "q0f16")).cpu_model().prefill(tokens[:20])
    ref = numpy_llama.forward(weights, cfg, tokens[:20])[-1]
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
