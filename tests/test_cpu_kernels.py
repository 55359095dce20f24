"""The CPU library's own linear kernels (compiler/cpu_schedule.py: q4 and float32, decode GEMV
and prefill matmul) against numpy, at shapes with ragged edges: token and row counts that do not
fill a tile, one and two groups per row, a residual."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from lantern import cpu_schedule
from lantern.quantize import dequantize_weight, get_quantization, quantize_weight

Q4 = get_quantization("q4f32_1")


@pytest.mark.parametrize(
    "weights,kind,k,n,tokens,residual",
    [
        ("q4", "gemv", 32, 5, 1, False),
        ("q4", "gemv", 96, 37, 1, True),
        ("q4", "gemv", 576, 300, 1, False),
        ("q4", "matmul", 32, 3, 1, False),
        ("q4", "matmul", 64, 7, 5, True),
        ("q4", "matmul", 96, 33, 13, False),
        ("q4", "matmul", 160, 9, 2, True),
        ("f32", "gemv", 16, 3, 1, False),
        ("f32", "gemv", 48, 37, 1, True),
        ("f32", "matmul", 4, 5, 1, False),
        ("f32", "matmul", 36, 7, 9, True),
    ],
)
def test_linear_kernel_matches_numpy(weights, kind, k, n, tokens, residual):
    rng = np.random.default_rng(k * n + tokens)
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(1, tokens, k)).astype(np.float32)
    res = rng.normal(size=(1, tokens, n)).astype(np.float32)
    if weights == "q4":  # the kernel reads the codes and scales; numpy, what they decode to
        qw, qs = quantize_weight(w, Q4)
        w, weight_args = dequantize_weight(qw, qs, Q4), [qw, qs.astype(np.float32)]
    else:
        weight_args = [w]
    want = x @ w.T + (res if residual else 0)
    build = getattr(cpu_schedule, f"{weights}_{kind}")  # e.g. cpu_schedule.q4_gemv
    lib = tvm.compile(build(k, residual), target="llvm")
    dev = tvm.cpu()
    args = [x, *weight_args, *([res] if residual else []), np.zeros((1, tokens, n), np.float32)]
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    lib(*tensors)
    assert np.abs(tensors[-1].numpy() - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize(
    "k,n,tokens,residual,gelu",
    [(8, 5, 3, False, True), (36, 7, 9, True, False), (64, 13, 1, False, False), (32, 4, 2, False, True)],
)
def test_encoder_linear_with_bias_matches_numpy(k, n, tokens, residual, gelu):
    """The float32 matmul's encoder epilogues (bias, then GELU or the residual) at rows and tokens that
    do not fill its 4 x 2 tile; GELU against scipy's erf."""
    from scipy.special import erf

    rng = np.random.default_rng(k + n + tokens)
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(1, tokens, k)).astype(np.float32)
    bias = rng.normal(size=(n,)).astype(np.float32)
    res = rng.normal(size=(1, tokens, n)).astype(np.float32)
    want = x.astype(np.float64) @ w.T + bias
    want = 0.5 * want * (1 + erf(want / np.sqrt(2))) if gelu else want + (res if residual else 0)
    lib = tvm.compile(cpu_schedule.f32_matmul(k, residual, bias=True, gelu=gelu), target="llvm")
    args = [x, w, bias, *([res] if residual else []), np.zeros((1, tokens, n), np.float32)]
    tensors = [tvm.runtime.tensor(a, tvm.cpu()) for a in args]
    lib(*tensors)
    assert np.abs(tensors[-1].numpy() - want).max() <= 1e-5 * np.abs(want).max()


def test_erf_fit_is_within_float32_rounding_of_erf():
    """kernels.ERF_P / ERF_Q, evaluated in float32 as the kernels do, against erf over its whole range."""
    from scipy.special import erf

    from lantern.kernels import ERF_P, ERF_Q

    x = np.linspace(-6, 6, 200_001).astype(np.float32)
    c = np.clip(x, np.float32(-4), np.float32(4))
    t = c * c
    horner = lambda coefficients: np.polyval(np.array(coefficients[::-1], np.float32), t).astype(np.float32)  # noqa: E731
    got = c * horner(ERF_P) / horner(ERF_Q)
    assert np.abs(got.astype(np.float64) - erf(x.astype(np.float64))).max() < 5e-7
