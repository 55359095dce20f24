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
    "kind,k,n,tokens,residual",
    [
        ("gemv", 32, 5, 1, False),
        ("gemv", 96, 37, 1, True),
        ("gemv", 576, 300, 1, False),
        ("matmul", 32, 3, 1, False),
        ("matmul", 64, 7, 5, True),
        ("matmul", 96, 33, 13, False),
        ("matmul", 160, 9, 2, True),
    ],
)
def test_q4_kernel_matches_numpy(kind, k, n, tokens, residual):
    rng = np.random.default_rng(k * n + tokens)
    qw, qs = quantize_weight(rng.normal(size=(n, k)).astype(np.float32), Q4)
    x = rng.normal(size=(1, tokens, k)).astype(np.float32)
    res = rng.normal(size=(1, tokens, n)).astype(np.float32)
    want = x @ dequantize_weight(qw, qs, Q4).T + (res if residual else 0)
    build = cpu_schedule.q4_gemv if kind == "gemv" else cpu_schedule.q4_matmul
    lib = tvm.compile(build(k, residual), target="llvm")
    dev = tvm.cpu()
    args = [x, qw, qs.astype(np.float32), *([res] if residual else []), np.zeros((1, tokens, n), np.float32)]
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    lib(*tensors)
    got = tensors[-1].numpy()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize(
    "kind,k,n,tokens,residual",
    [
        ("gemv", 16, 3, 1, False),
        ("gemv", 48, 37, 1, True),
        ("matmul", 4, 5, 1, False),
        ("matmul", 36, 7, 9, True),
    ],
)
def test_f32_kernel_matches_numpy(kind, k, n, tokens, residual):
    rng = np.random.default_rng(k * n + tokens)
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(1, tokens, k)).astype(np.float32)
    res = rng.normal(size=(1, tokens, n)).astype(np.float32)
    want = x @ w.T + (res if residual else 0)
    build = cpu_schedule.f32_gemv if kind == "gemv" else cpu_schedule.f32_matmul
    lib = tvm.compile(build(k, residual), target="llvm")
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in [x, w, *([res] if residual else []), np.zeros((1, tokens, n), np.float32)]]
    lib(*tensors)
    assert np.abs(tensors[-1].numpy() - want).max() <= 1e-5 * np.abs(want).max()
