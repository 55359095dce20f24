"""GPTQ onto the MLC grid, and the calibration pass that feeds it."""

import numpy as np
import pytest

import numpy_llama
from tiny_models import TINY_CONFIG, random_llama_weights

from lantern import gptq
from lantern.errors import LanternError
from lantern.models import llama
from lantern.quantize import QUANTIZATIONS, dequantize_weight, quantize_weight

Q4 = QUANTIZATIONS["q4f32_1"]


def activation_source(dim: int, seed: int = 0):
    """Draws activations like a transformer's: correlated channels, a few of them much larger."""
    rng = np.random.default_rng(seed)
    mixing = np.eye(dim) + 0.3 * rng.normal(size=(dim, dim)) / np.sqrt(dim)
    loud = rng.choice(dim, 4, replace=False)

    def draw(tokens: int) -> np.ndarray:
        x = rng.normal(size=(tokens, dim)) @ mixing
        x[:, loud] *= 20
        return x

    return draw


def output_error(w: np.ndarray, q_weight, q_scale, spec, hessian) -> float:
    diff = (w - dequantize_weight(q_weight, q_scale, spec)).astype(np.float64)
    return float(np.einsum("oi,ij,oj->", diff, hessian, diff))


@pytest.mark.parametrize("quant", ["q4f32_1", "q4f16_1"])
def test_gptq_beats_rounding_on_the_layer_output(quant, report):
    spec = QUANTIZATIONS[quant]
    rng = np.random.default_rng(0)
    w = rng.standard_t(4, size=(96, 256)).astype(np.float32) * 0.05
    draw = activation_source(256)
    x = draw(2048)
    hessian = x.T @ x / len(x)
    q, s = gptq.gptq_weight(w, hessian, spec)
    assert q.shape == (96, 32) and q.dtype == np.uint32 and s.shape == (96, 8) and s.dtype == spec.model_dtype
    # held-out inputs from the same distribution: GPTQ must not just fit the calibration rows
    x_new = draw(2048)
    h_new = x_new.T @ x_new / len(x_new)
    ours, rounded = output_error(w, q, s, spec, h_new), output_error(w, *quantize_weight(w, spec), spec, h_new)
    report(f"GPTQ vs round-to-nearest ({quant}), output error on new inputs: {ours / rounded:.2f}x")
    assert ours < 0.5 * rounded


@pytest.mark.parametrize("n", [7, 129, 300, 1000])
def test_the_inverse_cholesky_factor_is_the_textbook_one(n):
    """GPTQ's U (U^T U = H^-1, upper) without inverting H equals factoring the inverse, at sizes
    that split unevenly into halves."""
    x = activation_source(n, seed=n)(2 * n)
    h = x.T @ x / len(x) + 0.1 * np.eye(n)
    u = gptq.inverse_cholesky_upper(h)
    assert np.array_equal(u, np.triu(u))
    want = np.linalg.cholesky(np.linalg.inv(h)).T
    assert np.abs(u - want).max() <= 1e-9 * np.abs(want).max()


def test_float32_statistics_and_factor_keep_float64s_quality():
    """A build sums H and factors its inverse in float32 (``input_statistics``, ``gptq_weight``'s
    default): 2-2.4x faster than float64 at a 1.5B model's widths. On inputs like a transformer's the
    layer's output error must stay float64's within 1%, with nearly every code the same."""
    rng = np.random.default_rng(3)
    w = rng.standard_t(4, size=(64, 512)).astype(np.float32) * 0.05
    draw = activation_source(512, seed=3)
    xs = [draw(256).astype(np.float32) for _ in range(4)]
    h32 = gptq.input_statistics(xs)
    x = np.concatenate(xs).astype(np.float64)
    h64 = x.T @ x / len(x)
    assert h32.dtype == np.float32 and h32.flags.c_contiguous and np.array_equal(h32, h32.T)
    assert np.abs(h32 - h64).max() <= 1e-5 * np.abs(h64).max()
    fast, exact = gptq.gptq_weight(w, h32, Q4), gptq.gptq_weight(w, h64, Q4, precision=np.float64)
    assert np.mean(fast[0] == exact[0]) > 0.9  # 8 codes a word
    ratio = output_error(w, *fast, Q4, h64) / output_error(w, *exact, Q4, h64)
    assert abs(ratio - 1) < 0.01, ratio


def test_statistics_no_precision_can_factor_are_refused_naming_the_matrix():
    """Where float32's factor fails, float64 factors again, and where that fails too the error names
    the matrix. Only the refusal is caused here: with the damping, no statistics found so far factor
    in float64 but not in float32."""
    w = np.ones((4, 64), np.float32)
    h = np.ones((64, 64))
    h[np.diag_indices(64)] = 1e-3  # far from positive definite, beyond what the damping mends
    with pytest.raises(LanternError, match="statistics of a 4x64 matrix are not positive definite"):
        gptq.gptq_weight(w, h, Q4)


def test_inputs_that_never_fire_are_harmless():
    rng = np.random.default_rng(2)
    w = rng.normal(size=(8, 64)).astype(np.float32)
    x = rng.normal(size=(256, 64))
    x[:, :32] = 0  # a whole group never sees a nonzero input
    q, s = gptq.gptq_weight(w, x.T @ x, Q4)
    back = dequantize_weight(q, s, Q4)
    assert np.all(np.isfinite(back)) and np.all(np.isfinite(s))


def tiny_model():
    cfg = dict(TINY_CONFIG, vocab_size=512)
    hf = {k: v.astype(np.float32) for k, v in random_llama_weights(cfg).items()}
    conf = llama.LlamaConfig.from_hf(cfg)
    return cfg, hf, conf


def test_calibration_forward_matches_the_numpy_reference():
    cfg, hf, conf = tiny_model()
    params = llama.to_lantern(hf, conf)
    seqs = [[1, 5, 9, 200, 7, 3], [400, 2, 2, 2]]
    seen: list[tuple[str, list]] = []
    hidden = llama.calibration_forward(params, conf, seqs, lambda name, xs: seen.append((name, xs)))
    for seq, h in zip(seqs, hidden):
        ours = h @ params["model.embed_tokens.weight"].T
        np.testing.assert_allclose(ours, numpy_llama.forward(hf, cfg, seq), rtol=1e-4, atol=1e-4)
    names = [n for n, _ in seen]
    assert sorted(names) == sorted(conf.quantized_weights()) and len(set(names)) == len(names)
    for name, xs in seen:  # one input per sequence, as wide as the matrix's input
        assert [x.shape for x in xs] == [(len(s), params[name].shape[1]) for s in seqs], name


def test_quantize_calibrated_covers_every_matrix(real_tokenizer_dir, tmp_path):
    _, hf, conf = tiny_model()
    params = llama.to_lantern(hf, conf)
    text = tmp_path / "cal.txt"
    text.write_text("A short calibration text about ships, soup and SQL. " * 40)
    cal = gptq.load_calibration(text, (real_tokenizer_dir / "tokenizer.json").read_text(), 256)
    assert all(len(s) <= 256 for s in cal.sequences) and cal.manifest()["tokens"] >= 64
    cal.sequences = [[t % 512 for t in s] for s in cal.sequences]  # fold into the tiny vocabulary
    done = gptq.quantize_calibrated(llama.calibration_forward, params, conf, Q4, cal)
    assert set(done) == conf.quantized_weights()


def test_calibration_text_errors(real_tokenizer_dir, tmp_path):
    tokenizer = (real_tokenizer_dir / "tokenizer.json").read_text()
    with pytest.raises(LanternError, match="calibration text not found"):
        gptq.load_calibration(tmp_path / "missing.txt", tokenizer, 512)
    (tmp_path / "short.txt").write_text("Too short.")
    with pytest.raises(LanternError, match=r"short.txt has \d+ tokens; GPTQ needs at least 64"):
        gptq.load_calibration(tmp_path / "short.txt", tokenizer, 512)
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00bad" * 100)
    with pytest.raises(LanternError, match="binary.txt is not UTF-8 text"):
        gptq.load_calibration(tmp_path / "binary.txt", tokenizer, 512)
