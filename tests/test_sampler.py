"""The sampling functions of the model library (CPU build) against numpy, at the real vocabulary size."""

import numpy as np
import pytest

import sampling_reference as ref
from sampling_reference import V, nucleus_logits

from lantern.runtime.artifact import Artifact


@pytest.fixture(scope="module")
def lib(tiny_hf, build_artifact):
    return Artifact.open(build_artifact(tiny_hf[0], "q4f32_1")).cpu_model()


def test_logit_bias(lib):
    logits = np.random.default_rng(0).normal(size=(1, V)).astype(np.float32)
    ids, bias = np.array([5, 49151, 77], np.int32), np.array([1.5, -100, 3], np.float32)
    out = lib.call("apply_logit_bias_inplace", logits, np.zeros(3, np.int32), ids, bias)[0]
    expected = logits.copy()
    expected[0, ids] += bias
    np.testing.assert_array_equal(out, expected)


def test_penalties(lib):
    logits = np.random.default_rng(1).normal(size=(1, V)).astype(np.float32)
    ids, cnt = np.array([3, 10, 20000], np.int32), np.array([1, 4, 2], np.int32)
    pen = np.array([[0.5, 0.25, 1.3]], np.float32)
    out = lib.call("apply_penalty_inplace", logits, np.zeros(1, np.int32), np.zeros(3, np.int32), ids, cnt, pen)[0]
    np.testing.assert_allclose(out[0], ref.penalized(logits[0], ids, cnt, 0.5, 0.25, 1.3), rtol=1e-6)


def test_bitmask(lib):
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(1, V)).astype(np.float32)
    allowed = rng.random(V) < 0.3
    words = np.zeros((1, (V + 31) // 32), np.uint32)
    for v in np.flatnonzero(allowed):
        words[0, v // 32] |= np.uint32(1 << (v % 32))
    out = lib.call("apply_bitmask_inplace", logits, np.zeros(1, np.int32), words.view(np.int32))[0]
    np.testing.assert_array_equal(out[0, allowed], logits[0, allowed])
    assert np.all(out[0, ~allowed] == np.finfo(np.float32).min)


@pytest.mark.parametrize("temperature", [0.0, 1e-6, 0.7, 1.0, 2.5])
def test_softmax_with_temperature(lib, temperature):
    logits = np.random.default_rng(3).normal(0, 3, (1, 1, V)).astype(np.float32)
    logits[0, 0, [7, 900]] = logits.max() + 1  # a tie at the top: greedy splits it evenly
    out = lib.call("softmax_with_temperature", logits, np.array([temperature], np.float32))[0]
    np.testing.assert_allclose(out[0, 0], ref.softmax(logits[0, 0], temperature), rtol=1e-4, atol=1e-9)


def test_argsort_is_a_full_descending_sort_with_id_ties(lib):
    rng = np.random.default_rng(4)
    probs = rng.random(V).astype(np.float32)
    probs[100:200] = 0.5  # ties are ordered by token id
    probs /= probs.sum()
    sorted_probs, sorted_ids = lib.call("argsort_probs", probs[None])
    order = ref.argsort_desc(probs)
    np.testing.assert_array_equal(sorted_ids[0], order)
    np.testing.assert_array_equal(sorted_probs[0], probs[order])


@pytest.mark.parametrize("nucleus", [1, 10, 1000])
def test_top_p_sampling_matches_reference(lib, nucleus):
    logits = nucleus_logits(nucleus, seed=nucleus)
    probs = ref.softmax(logits, 1.0).astype(np.float32)
    order = ref.argsort_desc(probs)
    sp, si = probs[order][None], order.astype(np.int32)[None]
    mass = np.cumsum(sp[0].astype(np.float64))
    top_p = float(mass[nucleus - 1]) * 0.999 if nucleus > 1 else 0.5
    us = np.random.default_rng(nucleus).random(64).astype(np.float32)
    got = lib.call("sample_with_top_p", sp, si, us, np.zeros(64, np.int32), np.array([top_p], np.float32))[0]
    expected = [ref.top_p_token(sp[0], si[0], float(u), top_p) for u in us]
    assert list(got) == expected
    assert set(got) <= set(order[:nucleus].tolist())
    if nucleus >= 10:
        assert len(set(got)) > 1  # really samples across the nucleus


def test_greedy_pipeline_picks_argmax(lib):
    logits = nucleus_logits(1000, seed=9)[None, None]
    probs = lib.call("softmax_with_temperature", logits, np.array([1e-6], np.float32))[0]
    sp, si = lib.call("argsort_probs", probs[0])
    token = lib.call(
        "sample_with_top_p", sp, si, np.array([0.73], np.float32), np.zeros(1, np.int32), np.array([1.0], np.float32)
    )[0]
    assert token[0] == int(np.argmax(logits))
