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
